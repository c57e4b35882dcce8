"""``deepgap serve`` for decoders (issue 51 item 4): continuous batching, TTFT/TPOT, capacity, the simulator.

Cheap on purpose: the loop runs on virtual clocks; the "real" run beside the simulator is the worker's executor
with the tiny model on a scripted clock (its prefill and decode steps charged known times), so prediction and
run are compared exactly and no wall-clock time is asserted; one serve runs end to end in this process
(`conftest.inprocess_serving`) with a few hundred short requests.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
from clirun import SERVE_TINY_DECODER, deepgap_cli
from conftest import inprocess_serving

from deepgap.core.errors import UsageError
from deepgap.serving.capacity.search import LoadSettings, Probe, find_capacity, schedule
from deepgap.serving.run.spec import ServeSpec, validate
from deepgap.serving.sim.batcher import BatchPolicy
from deepgap.serving.sim.clock import VirtualClock
from deepgap.serving.sim.continuous import SlotStop, serve_continuous
from deepgap.serving.sim.llm_service import LlmLoad, LlmService, simulate_llm
from deepgap.serving.sim.seqlen import parse_seq_len_dist
from deepgap.serving.sim.token_stats import summarize_tokens, tail

PREFILL_PER_TOKEN, STEP_S = 2e-5, {1: 1e-3, 2: 1.2e-3, 4: 1.5e-3}


def _load(ins="uniform:4:16", outs="fixed:4"):
    return LlmLoad(parse_seq_len_dist(ins, 8, 512), parse_seq_len_dist(outs, 8, 512))


def _service():
    """Curves of a server whose prefill costs 20 µs per padded token and whose step costs ``STEP_S``."""
    prefill = {v: {b: np.full(3, PREFILL_PER_TOKEN * b * v) for b in (1, 2, 4)} for v in (4, 8, 12, 16)}
    return LlmService(prefill, {s: np.full(5, t) for s, t in STEP_S.items()}, 20)


class Scripted:
    """An executor on a virtual clock charging the scripted times; ``inner`` (the worker's) really runs."""

    def __init__(self, clock, slots, inputs, inner=None):
        self.clock, self.slots, self.inputs, self.inner = clock, slots, inputs, inner
        self.batches: list[int] = []

    def prefill(self, first, count, slots):
        if self.inner is not None:
            self.inner.prefill(first, count, slots)
        self.batches.append(count)
        self.clock.advance(PREFILL_PER_TOKEN * count * int(self.inputs[first : first + count].max()))

    def decode(self, active):
        assert active.sum() <= self.slots
        if self.inner is not None:
            self.inner.decode(active)
        self.clock.advance(STEP_S[self.slots])


@pytest.mark.parametrize(
    "ins,outs,want",
    [
        ("uniform:64:256", "fixed:128", 160 + 63),  # issue 51's served load: 127 steps from the prompt's end
        ("fixed:100", "fixed:1", 100),  # no decode step at all: the prompt's end
        ("fixed:100", "uniform:2:4", 101),  # 1, 2 or 3 steps: j = 0; 0, 1; 0, 1, 2 -> 4 / 6 of a position
        (
            "32:3,64",
            "fixed:9",
            44,
        ),  # a weighted choice: E[in] = 40, eight steps 3.5 on: 43.5, rounded to even
    ],
)
def test_the_decode_step_is_calibrated_at_the_loads_mean_position(ins, outs, want):
    """`LlmLoad.decode_position`: over every decode step of every request, the mean position attended up to,
    which the worker's calibration gives every slot (its attention reads each row up to its position)."""
    load = LlmLoad(parse_seq_len_dist(ins, 1, 512), parse_seq_len_dist(outs, 1, 512))
    assert load.decode_position() == want < load.cache_len
    values, p = load.inputs.support()
    assert float(values @ p) == pytest.approx(load.inputs.mean())


def test_a_decoders_setup_request_carries_the_calibration_position():
    """`llm_setup_fields` hands the position to the worker (`SetupRequest.decode_position`), which times every
    slot there (`llm_setup.calibration_position`); a request without one keeps half the cache."""
    from deepgap.serving.run.process import SetupRequest
    from deepgap.serving.run.rows import setup_request
    from deepgap.serving.run.spec import ServeSpec
    from deepgap.serving.worker.llm_setup import calibration_position

    spec = ServeSpec(
        model="llama-tiny", device="cpu", qps=5.0, input_len_dist="uniform:8:24", output_len_dist="fixed:9"
    )
    req = setup_request(spec, "llama-tiny", "cpu")
    assert (req.cache_len, req.decode_position, calibration_position(req)) == (33, 20, 20)  # round(16 + 3.5)
    old = SetupRequest(**{**dataclasses.asdict(req), "decode_position": 0})
    assert calibration_position(old) == 33 // 2


def test_the_simulators_service_takes_the_calibrations_two_positions():
    """`llm_run.service_from`: the position the curve was timed at and each slot count's step at position 0
    reach the service (its line); a calibration without them leaves the step the curve's wherever its rows."""
    from types import SimpleNamespace

    from deepgap.serving.run.llm_run import _step_words, service_from

    req = SimpleNamespace(cache_len=40)
    reply = SimpleNamespace(
        curves_by_len={8: {1: [1e-3]}},
        curve_samples_s={4: [2e-3, 2e-3]},
        curve_parts_s={4: {"compute_s": 2e-3, "interval_s": 2e-3, "at_zero_s": 1e-3}},
        engine_info={"decode_calibrated_at": 20},
    )
    sv = service_from(reply, req, "t")
    assert (sv.position, sv.decode_at_zero) == (20, {4: 1e-3}) and sv.positions_known(4)
    assert _step_words(reply, req, 4).endswith("every slot at position 20 (at position 0: 1.000 ms, median)")
    reply.engine_info, reply.curve_parts_s = {}, {4: {"compute_s": 2e-3}}
    old = service_from(reply, req, "t")
    assert not old.positions_known(4) and _step_words(reply, req, 4).endswith("40 positions each")


def test_a_bucketed_server_is_charged_its_bucket_not_the_newcomers_count():
    """Five newcomers of up to 6 tokens run as the bucket of 6 prompts of 8 positions on a bucketed server."""
    counts = (1, 2, 3, 4, 6, 8)
    prefill = {v: {b: np.full(3, PREFILL_PER_TOKEN * b * v) for b in counts} for v in (4, 8, 12, 16)}
    step = {s: np.full(5, t) for s, t in STEP_S.items()}
    bucketed = LlmService(prefill, step, 20, counts=counts, quantum=4)
    assert bucketed.prefill_s(5, 6) == pytest.approx(PREFILL_PER_TOKEN * 6 * 8)
    assert LlmService(prefill, step, 20).prefill_s(5, 6) == pytest.approx(PREFILL_PER_TOKEN * 5 * 6)
    # past the largest bucket the server prefills eagerly, unpadded: in proportion to the largest
    assert bucketed.prefill_s(10, 6) == pytest.approx(PREFILL_PER_TOKEN * 10 * 6)


def test_packed_buckets_pad_at_most_a_fifth_past_128_rows_and_split_in_arrival_order():
    from deepgap.serving.sim.packing import PACKED_TOKENS, groups, smallest_bucket, token_buckets

    top = token_buckets(PACKED_TOKENS)
    assert top[:9] == (64, 96, 128, 160, 192, 224, 256, 320, 384) and top[-1] == PACKED_TOKENS
    assert token_buckets(24) == (64,) and token_buckets(100)[-1] == 128
    assert all(
        smallest_bucket(n, top) - n <= smallest_bucket(n, top) / 3 for n in range(64, PACKED_TOKENS + 1)
    )
    assert all(
        smallest_bucket(n, top) - n <= smallest_bucket(n, top) / 5 for n in range(129, PACKED_TOKENS + 1)
    )
    assert groups([5, 6, 7, 1, 1], 12, 8) == [(0, 2), (2, 5)] and groups([1] * 5, 99, 2) == [
        (0, 2),
        (2, 4),
        (4, 5),
    ]
    assert groups([20], 12, 8) == [(0, 1)] and groups([], 12, 8) == []


def test_a_packed_server_is_charged_the_bucket_of_its_admissions_total_tokens():
    """Packed, an admission costs its bucket of token rows (the prompts' sum), not count × longest; one over the
    largest bucket, or over the prompts one prefill takes, is charged each packed prefill it splits into."""
    tokens = (8, 12, 16, 24, 32)
    prefill = {t: {1: np.full(3, PREFILL_PER_TOKEN * t)} for t in tokens}
    packed = LlmService(prefill, {s: np.full(5, t) for s, t in STEP_S.items()}, 20, tokens=tokens, prompts=3)
    assert packed.admission_s([6, 5, 6]) == pytest.approx(PREFILL_PER_TOKEN * 24)  # 17 rows in 24, not 3 × 6
    assert packed.admission_s([9]) == pytest.approx(PREFILL_PER_TOKEN * 12)
    # 20 + 15 tokens: over 32 rows, so two prefills (24 and 16 rows); 4 prompts of 1: over 3 prompts
    assert packed.admission_s([20, 15]) == pytest.approx(PREFILL_PER_TOKEN * (24 + 16))
    assert packed.admission_s([1, 1, 1, 1]) == pytest.approx(PREFILL_PER_TOKEN * (8 + 8))
    # the padded server's charge for the first: 4 prompts padded to the longest
    assert _service().admission_s([6, 5, 2, 4]) == pytest.approx(PREFILL_PER_TOKEN * 4 * 6)
    # and the simulator's executor charges it so
    clock = VirtualClock()
    from deepgap.serving.sim.llm_service import VirtualSlots

    VirtualSlots(packed, clock, 4, np.array([6, 5, 2, 4]), None).prefill(0, 4, [0, 1, 2, 3])
    assert clock.now() == pytest.approx(PREFILL_PER_TOKEN * (16 + 8))  # 3 prompts (13 rows → 16), then 4 → 8


def test_continuous_loop_admits_at_every_step_and_times_each_token():
    load = _load()
    arrivals = np.array([0.0, 0.0, 0.0005, 0.0021, 0.0022, 0.01])
    ins, outs = load.draw(6, 0)
    clock = VirtualClock()
    ex = Scripted(clock, 2, ins)
    log = serve_continuous(arrivals, ins, outs, 2, clock, ex)
    assert log.n == 6 and max(ex.batches) <= 2 and log.steps > 0
    assert np.all(log.first_s >= log.admit_s) and np.all(log.admit_s >= log.arrival_s)
    # a later token takes one step, plus any newcomer's prefill run between two steps (no chunking): alone,
    # the last request's TPOT is the step's time exactly
    assert (log.tpot_s >= STEP_S[2] - 1e-12).all() and log.tpot_s.max() > STEP_S[2]
    assert log.tpot_s[-1] == pytest.approx(STEP_S[2])
    np.testing.assert_allclose(log.ttft_s, log.admit_s - log.arrival_s + (log.first_s - log.admit_s))
    c = log.columns()
    np.testing.assert_allclose(c["queue_s"] + c["compute_s"], log.ttft_s)  # stored: TTFT = queue + prefill
    assert 1 < log.mean_active <= 2


def test_tails_are_p99_only_from_368_requests_and_both_bounds_judge_the_level():
    assert tail(np.arange(367.0))[1:] == ("max", 367) and tail(np.arange(368.0))[1:] == ("p99", 368)
    load, sv = _load(), _service()
    ok = summarize_tokens(simulate_llm(schedule(50.0, 500, 0), load, 4, sv, 0), 50.0, 1.0, 0.01)
    t = ok.tokens
    assert ok.verdict == "pass" and t.ttft_tail_kind == "p99" and t.ttft_n == 500 and t.tpot_n == 500
    assert t.output_tokens_per_s == pytest.approx(4 * ok.achieved_qps)
    tight = summarize_tokens(simulate_llm(schedule(50.0, 500, 0), load, 4, sv, 0), 50.0, 1.0, 1e-3)
    assert (
        tight.verdict == "fail"
        and tight.tokens.ttft_verdict == "pass"
        and tight.tokens.tpot_verdict == "fail"
    )


def test_overload_drops_waiting_requests_and_stops_once_it_cannot_pass():
    load, sv = _load("fixed:16", "fixed:40"), _service()
    n, rate = 600, 2000.0
    stop = SlotStop(0.05, 0.1, 5, None, 0.1)
    log = simulate_llm(schedule(rate, n, 0), load, 1, sv, 0, stop)
    s = summarize_tokens(log, rate, 0.05, 0.1)
    assert log.stop_kind == "violations" and log.n < n and s.verdict == "fail"


def test_simulator_predicts_a_scripted_run_of_the_real_executor_exactly():
    """The worker's executor (tiny model, its tokens computed) on a scripted clock vs the simulator on its curves."""
    import torch

    from deepgap.measure.models.llama_net import build_llama
    from deepgap.serving.worker.llm_executor import SlotExecutor

    load, sv = _load(), _service()
    model = build_llama("llama-tiny", seed=0)
    ex = SlotExecutor(model, "cpu", 4, load.cache_len, 16, seed=0)

    def real(rate: float, slots: int, n: int):
        ins, outs = load.draw(n, 0)
        clock = VirtualClock()
        ex.set_level(slots, ins)
        with torch.inference_mode():
            return serve_continuous(
                schedule(rate, n, 0), ins, outs, slots, clock, Scripted(clock, slots, ins, ex)
            )

    got = real(400.0, 2, 60)
    want = simulate_llm(schedule(400.0, 60, 0), load, 2, sv, 0, draw_seed=None)
    for name in ("arrival_s", "admit_s", "first_s", "done_s", "prefill_batch"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), err_msg=name)
    # the capacity search over the scripted real runs ends where the simulator's does
    settings = LoadSettings(slo_s=0.01, confidence=0.3, min_queries=40, min_duration_s=0.01, max_queries=80)

    def probe(run):
        def at(rate):
            n = settings.n_for(rate)
            s = summarize_tokens(run(rate, n), rate, 0.01, 2e-3, 0.99, 0.3)
            return Probe(rate, s, s.verdict == "pass")

        return at

    def simulated(rate, n):
        return simulate_llm(schedule(rate, n, 0), load, 2, sv, 0, draw_seed=None)

    caps = [
        find_capacity(probe(fn), BatchPolicy(2, 0.0), 0.01, 500.0, 5000.0, rel_tol=0.1).capacity_qps
        for fn in (lambda rate, n: real(rate, 2, n), simulated)
    ]
    assert caps[0] == caps[1] > 0


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"input_len_dist": "fixed:400", "output_len_dist": "fixed:200"}, "past llama-tiny's context of 512"),
        ({"output_len_dist": "fixed:1"}, "under 2 tokens"),
        ({"input_len_dist": "uniform:64:8"}, "64 > 8"),
        ({"max_batch": 100_000, "batch_sizes": (1, 100_000)}, "batch 100000 is out of range"),
        ({"model": "llama-3.1-8b", "batch_sizes": (60_000,), "input_len_dist": "fixed:60000"}, "TiB"),
        ({"model": "tinybert", "input_len_dist": "fixed:16"}, "--input-len-dist applies to decoders"),
        ({"model": "tinycnn", "slo_tpot_s": 0.1}, "--slo-tpot applies to decoders"),
        ({"loadgen": True}, "--loadgen does not apply to serving a decoder"),
        ({"tenants": (("llama-tiny", None), ("tinycnn", None))}, "--tenants does not serve decoders"),
        ({"slo_s": 0.015}, "bound a decoder with --slo-ttft"),
        (
            {"engine": "tensorrt"},
            "decodes with eager, cudagraph, compile-reduce-overhead, quant, not tensorrt",
        ),
        ({"scenario": "offline", "qps": None}, "server scenario only"),
    ],
)
def test_decoder_serve_refuses_bad_input_in_one_line(changes, needle):
    spec = ServeSpec(model="llama-tiny", device="cpu", qps=5.0).replace(**changes)
    with pytest.raises(UsageError, match=needle):
        validate(spec)


def test_a_bad_prefill_mode_is_refused_before_any_worker(monkeypatch):
    """DEEPGAP_SERVE_PREFILL outside packed/padded: one line at validation, not a worker's set-up error."""
    monkeypatch.setenv("DEEPGAP_SERVE_PREFILL", "chunked")
    with pytest.raises(UsageError, match="DEEPGAP_SERVE_PREFILL=chunked.*packed or padded"):
        validate(ServeSpec(model="llama-tiny", device="cpu", qps=5.0))


def test_bad_decoder_flags_exit_2_and_write_nothing(tmp_path):
    store = tmp_path / "never.sqlite"
    p = deepgap_cli(
        "serve", "--model", "llama-tiny", "--device", "cpu", "--qps", "5", "--output-len-dist", "fixed:500",
        "--store", str(store),
    )  # fmt: skip
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "context of 512" in p.stderr
    assert not store.exists() and not list(tmp_path.iterdir())


def test_serve_llama_tiny_finds_capacity_and_stores_tokens_and_tails(tmp_path, monkeypatch):
    inprocess_serving(monkeypatch)
    store = str(tmp_path / "llm.sqlite")
    args = ["--model", "llama-tiny", "--device", "cpu", "--threads", "1", "--batch-sizes", "1,2,4"]
    args += ["--curve-iterations", "4", "--input-len-dist", "uniform:4:16", "--output-len-dist", "fixed:4"]
    args += ["--find-capacity", "--confidence", "0.3", "--min-queries", "40", "--min-duration", "0.05s"]
    args += ["--max-queries", "100", "--verify-policies", "1", "--slo-ttft", "5s", "--slo-tpot", "1s"]
    p = deepgap_cli("serve", *args, "--no-telemetry", "--store", store, "--json")
    assert p.returncode == 0, p.stderr
    assert "set-up" not in p.stderr  # --json: the worker's progress is as silent as the command's own
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert (
        out["capacity_qps"] > 0 and out["capacity_predicted_qps"] > 0 and out["capacity_slots"] in (1, 2, 4)
    )
    assert out["capacity_output_tokens_per_s"] > 0 and out["capacity_ttft_tail_kind"] == "max"  # n < 368
    assert (out["slo_ttft_s"], out["slo_tpot_s"]) == (5.0, 1.0)
    from deepgap.serving.show.llm_tables import llm_levels
    from deepgap.store import Store

    s = Store(store, readonly=True)
    try:
        lv = llm_levels(s)
    finally:
        s.close()
    assert len(lv) and (lv["output_tokens_per_s"] > 0).all() and set(lv["ttft_tail_kind"]) == {"max"}
    assert (lv["predicted_output_tokens_per_s"] > 0).all() and set(lv["output_len_dist"]) == {"fixed:4"}
    assert all(lv["ttft_n"] == lv["n"])
    # the set-up's words on every level: the step, and how admissions prefill (packed, eager on a CPU)
    assert set(lv["decode_step"]) == {"eager static step"} and all(
        a.startswith("packed") for a in lv["admissions"]
    )
    assert set(lv["calibrated_at"]) == {10 + 1}  # `LlmLoad.decode_position`: E[in] 10, three steps from there
    shown = deepgap_cli("show", store)
    assert shown.returncode == 0 and "decoders" in shown.stdout and "max of" in shown.stdout
    from deepgap.serving.show.report_section import section

    found, _ = section(store)
    assert len(found["serving_llm"]) == len(lv)
    csv = tmp_path / "llm.csv"
    assert deepgap_cli("export", store, "-o", str(csv)).returncode == 0
    import pandas as pd

    ex = pd.read_csv(csv)
    assert set(ex["workload"]) == {"serve-decoder", "serve-capacity"}  # the levels, then the capacities
    lvx = ex[ex["workload"] == "serve-decoder"]
    assert (
        len(lvx) == len(lv)
        and (lvx["output_tokens_per_s"] > 0).all()
        and set(lvx["ttft_tail_kind"]) == {"max"}
    )
    assert (
        set(lvx["serve_decode_step"]) == {"eager static step"}
        and lvx["serve_prefill"].str.startswith("packed").all()
        and set(lvx["decode_calibrated_position"]) == {11}
    )
    cap = ex[(ex["workload"] == "serve-capacity") & (ex["source"] == "measured")]
    assert cap["output_tokens_per_s"].tolist() == [pytest.approx(out["capacity_output_tokens_per_s"])]
    caps = ex[ex["workload"] == "serve-capacity"]  # measured and simulated: the set-up's admissions on each
    assert len(caps) > 1 and caps["serve_prefill"].str.startswith("packed").all()
    # the capacity table's engine cells (the levels' cells wrap in the console: `engine_cell` is tested alone)
    assert shown.stdout.count("eager · eager admissions") >= len(caps)


def test_simulators_jump_over_uneventful_steps_gives_the_one_at_a_time_times():
    """`VirtualSlots.decode_steps` (many steps per loop iteration) against one step per iteration, exactly."""
    from deepgap.serving.sim.llm_service import VirtualSlots

    load = _load("uniform:4:16", "uniform:2:30")
    steps = {s: np.linspace(0.9, 1.2, 7) * t for s, t in STEP_S.items()}
    jitter = LlmService(_service().prefill, steps, 46)
    # and with the step's line over its rows' positions (timed at 20, and at 0 for 60% of the time)
    lined = LlmService(_service().prefill, steps, 46, position=20, decode_at_zero={1: 6e-4, 4: 9e-4})
    ins, outs = load.draw(300, 0)
    draws = np.random.default_rng(0).random(512)

    class OneAtATime:
        def __init__(self, inner):
            self.inner = inner

        def prefill(self, *args):
            self.inner.prefill(*args)

        def decode(self, active):
            self.inner.decode_steps(1, np.inf, active)

    for service, slots in itertools.product((jitter, lined), (1, 4)):
        logs = []
        for wrap in (lambda x: x, OneAtATime):
            clock = VirtualClock()
            ex = wrap(VirtualSlots(service, clock, slots, ins, draws))
            logs.append(serve_continuous(schedule(300.0, 300, 0), ins, outs, slots, clock, ex))
        assert logs[0].steps == logs[1].steps
        assert np.allclose(logs[0].done_s, logs[1].done_s, rtol=0, atol=1e-12) and np.allclose(
            logs[0].first_s, logs[1].first_s, rtol=0, atol=1e-12
        )
    assert logs[0].end_s < simulate_llm(schedule(300.0, 300, 0), load, 4, jitter, 0).end_s  # cheaper rows


def test_a_decode_step_costs_the_line_between_its_two_calibrated_positions():
    """`LlmService.decode_times`: every slot at the timed position costs the curve's step, every slot at 0 the
    step timed there, and between, the line at the rows' summed positions; `VirtualSlots` keeps each slot's
    position as the real executor does (the prompt's length, one more a step, 0 once retired)."""
    from deepgap.serving.sim.llm_service import VirtualSlots

    sv = LlmService(_service().prefill, {4: np.full(5, 2e-3)}, 40, position=20, decode_at_zero={4: 1e-3})
    got = sv.decode_times(4, 3, None, np.array([80, 0, 40]))
    np.testing.assert_allclose(got, [2e-3, 1e-3, 1.5e-3])
    assert sv.positions_known(4) and not sv.positions_known(2)
    np.testing.assert_allclose(LlmService(sv.prefill, sv.decode, 40).decode_times(4, 2, None, [0, 9]), 2e-3)
    clock = VirtualClock()
    vs = VirtualSlots(sv, clock, 4, np.array([10, 6, 3]), None)
    vs.prefill(0, 2, [3, 1])
    assert vs.pos.tolist() == [0, 6, 0, 10]
    active = np.array([False, True, False, True])
    assert vs.decode_steps(3, np.inf, active) == 3
    assert vs.pos.tolist() == [0, 9, 0, 13]
    # the three steps read 16, 18 and 20 of the 80 timed positions
    assert clock.now() == pytest.approx(
        sum(1e-3 + 1e-3 * r / 80 for r in (16, 18, 20)) + sv.admission_s([10, 6])
    )
    vs.decode(np.array([False, True, False, False]))  # slot 3 retired: its row back at 0
    assert vs.pos.tolist() == [0, 10, 0, 0]
    vs.prefill(2, 1, [0])  # one token out: retired at its prefill, never run by a step
    vs.decode(np.array([False, True, False, False]))
    assert vs.pos.tolist() == [0, 11, 0, 0]


def test_a_decoders_default_slots_on_a_gpu_are_the_four_largest_whose_cache_fits():
    """Without --batch-sizes a decoder calibrates `llm_spec.decoder_slots` on a GPU, the image servers' 1-128
    elsewhere; the largest default's KV cache fits `SLOT_CACHE_BYTES`, twice it would not."""
    from deepgap.measure.models.llama_config import SHAPES
    from deepgap.serving.run.llm_spec import SLOT_CACHE_BYTES, llm_load
    from deepgap.serving.run.spec import CPU_BATCHES, GPU_BATCHES, ServeSpec

    def spec(ins: str, outs: str, kv: str = "auto", **kw) -> ServeSpec:
        return ServeSpec(
            model="llama-3.1-8b", engine="quant", precision="fp8", input_len_dist=ins, output_len_dist=outs,
            kv_cache=kv, **kw,
        )  # fmt: skip

    mlperf = spec("uniform:64:256", "fixed:128")  # 384 positions of 131 KB (bf16 K and V): 25.8 GB at 512
    assert mlperf.buckets("cuda") == (64, 128, 256, 512) and mlperf.buckets("cpu") == CPU_BATCHES
    long, codes = spec("fixed:1000", "fixed:1000"), spec("fixed:1000", "fixed:1000", "fp8")
    assert long.buckets("cuda") == (8, 16, 32, 64) and codes.buckets("cuda") == (16, 32, 64, 128)
    for s, itemsize in ((mlperf, 2), (long, 2), (codes, 1)):
        per_slot = llm_load(s).cache_len * SHAPES["llama-3.1-8b"].kv_bytes_per_token(itemsize)
        top = max(s.buckets("cuda"))
        assert top * per_slot <= SLOT_CACHE_BYTES < (2 * top * per_slot if top < 512 else math.inf)
    assert spec("fixed:128", "fixed:128", batch_sizes=(512,)).buckets("cuda") == (512,)  # the flag wins
    assert spec("fixed:128", "fixed:128", max_batch=200).buckets("cuda") == (64, 128, 200)
    assert ServeSpec(model="resnet50").buckets("cuda") == GPU_BATCHES  # an image server's, as before


def test_a_decoders_setup_says_each_phase_as_it_ends(tmp_path, monkeypatch):
    """The worker's set-up names each phase and its seconds on the command's console, so a stall shows where."""
    inprocess_serving(monkeypatch)
    p = deepgap_cli("serve", *SERVE_TINY_DECODER, "--batch-sizes", "2", "--store", str(tmp_path / "s.sqlite"))
    assert p.returncode == 0, p.stderr
    said = [line for line in p.stderr.splitlines() if line.startswith("serve: set-up: ")]
    phases = ["model built", "decode step prepared for 1 slot count(s) (eager)", "prefills prepared (eager)"]
    phases += ["continuous batching checked", "decode calibrated", "prefill calibrated"]
    assert len(said) == len(phases) and all(
        line[15:].startswith(ph) for line, ph in zip(said, phases, strict=True)
    )
    assert "1.000 of greedy tokens as fp32's, each request alone" in said[3]
    assert "2 slots" in said[4] and "at position 11" in said[4]
