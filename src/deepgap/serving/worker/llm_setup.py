"""``serve.setup`` and ``serve.level`` for a decoder: build, check continuous batching, calibrate, serve.

Runs in the worker process only. The decoder is built with seeded weights on the device in the
precision (`deepgap.measure.decode_config`'s way); its cache holds the largest calibrated slot count, in the
decoder's dtype or as fp8 codes (``kv_cache``, `deepgap.serving.worker.llm_engines.served_model`).

- **Check**: a few requests of different prompt and output lengths, arriving while others decode, go
  through the server's own loop (`serve_continuous`, on a virtual clock so admissions interleave the
  same way on any machine) with two slots, stepped as the smallest prepared slot count; each request's
  greedy tokens are compared with the fp32 decoder's for that request alone (`llm_timing.generate`, the
  same seeded weights in fp32 on the same device). A wrong per-row position, mask or cache write shows up
  as a token that differs; in fp32 that is flagged, in lower precisions a near-tie may part (recorded), and
  so with an fp8 cache (``kv_cache``: fp8's bounds, `deepgap.measure.correctness.bounds_of`, as the sweep's
  check).
- **Calibration**: the decode step at every slot count (`curve_iterations` steps each, synchronised;
  the step is static, so its time does not depend on which slots hold a sequence; its attention reads each
  row up to its position, so every slot sits at the load's mean decode position, `LlmLoad.decode_position`,
  and a few steps more at position 0: the two ends of the simulator's line, `LlmService.decode_times`),
  and the prefill as the server runs it: packed, every bucket of ``T`` token rows (stored as batch 1 at
  length ``T``); padded, every calibrated batch and every admission bucket's count at every calibrated
  prompt length. They are the simulator's curves (`deepgap.serving.sim.llm_service.LlmService`):
  ``curve_samples_s`` per slot count, ``curves_by_len`` prompt length (packed: rows) → batch → prefill seconds.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from deepgap.core.progress import Phases
from deepgap.measure.correctness import bounds_of
from deepgap.measure.device import set_tf32
from deepgap.measure.llm_timing import generate
from deepgap.measure.models.llama_net import build_llama
from deepgap.measure.quant.linear import row_kernel_on
from deepgap.measure.timing import HostClock
from deepgap.serving.run.process import LevelRequest, SetupReply, SetupRequest
from deepgap.serving.sim.clock import RealClock, VirtualClock
from deepgap.serving.sim.continuous import SlotStop, TokenLog, serve_continuous
from deepgap.serving.worker.llm_engines import allow_compiles, served_model, served_step
from deepgap.serving.worker.llm_executor import SlotExecutor
from deepgap.serving.worker.llm_prefill import LENGTH_QUANTUM, BucketedPrefill, Each, PackedPrefill
from deepgap.serving.worker.server import quiet_gc
from deepgap.serving.worker.setup_common import setup_phases, setup_reply

CHECK_REQUESTS = 5
CHECK_OUTPUT = 8  # the check's longest output (tokens)


def llm_setup(state: Any, req: SetupRequest) -> tuple[SlotExecutor, SetupReply]:
    """Build ``req.model``, check continuous batching against each request alone, calibrate both curves."""
    phases = setup_phases()
    plan = served_step(req.engine, req.device.startswith("cuda"))
    torch.set_num_threads(req.threads or state.default_threads)
    set_tf32(req.precision)
    model = served_model(req.model, req.precision, req.seed, req.device, req.kv_cache)
    phases.done("model built")
    lens = req.seq_lens  # the calibrated prompt lengths
    if plan.compile_mode:
        allow_compiles(len(req.buckets))
    ex = SlotExecutor(
        model, req.device, max(req.buckets), req.cache_len, max(lens), req.seed, plan.graph,
        compile_mode=plan.compile_mode,
    )  # fmt: skip
    with torch.inference_mode():
        for s in req.buckets:  # a CUDA graph per slot count, captured before anything is served
            ex.steps.prepare(s)
        phases.done(f"decode step prepared for {len(req.buckets)} slot count(s) ({_prepared(plan)})")
        each = _bucket_phases(phases, plan)
        if isinstance(ex.prefills, PackedPrefill):  # and one per admission bucket
            ex.prefills.prepare(each)
        elif ex.prefills is not None:
            ex.prefills.prepare(max(lens), each)
    phases.done(f"prefills prepared ({_prepared(plan) if ex.prefills is not None else 'eager'})")
    check = _check(req, ex)
    agree = f": {check['top1_agreement']:.3f} of greedy tokens as fp32's, each request alone"
    phases.done("continuous batching checked", agree)
    decode, parts = _decode_curve(ex, req)
    at = calibration_position(req)
    phases.done(
        "decode calibrated",
        "".join(
            f"; {s} slots {p['interval_s'] * 1e3:.2f} ms a step at position {at}, {p['at_zero_s'] * 1e3:.2f} at 0"
            for s, p in parts.items()
        ),
    )
    packed = ex.prefills if isinstance(ex.prefills, PackedPrefill) else None
    prefill = (
        _packed_curve(ex, req, packed, phases) if packed else {v: _prefill_curve(ex, req, v) for v in lens}
    )
    phases.done("prefill calibrated")
    padded = ex.prefills if isinstance(ex.prefills, BucketedPrefill) else None
    reply = setup_reply(
        state,
        req,
        ex,
        decode,
        parts,
        check,
        phases,
        engine_info={
            "decode_step": plan.label,
            "prefill": _prefill_label(ex),
            "linears": f"{req.precision} per output channel (the sweep's LINEAR_SWAPS)"
            if req.engine == "quant"
            else None,
            "cache_len": req.cache_len,
            "decode_calibrated_at": at,  # every slot's position while steps were timed
            "kv_cache": "fp8 (e4m3 codes at scale 1)" if req.kv_cache == "fp8" else None,
            "kv_cache_bytes": model.cache.nbytes,  # every slot's K and V as allocated (and its sink row)
            # what the simulator charges an admission at (`LlmService.prefill_s`): its bucket
            "prefill_counts": list(padded.counts) if padded else None,
            "prefill_quantum": LENGTH_QUANTUM if padded else None,
            # packed: its buckets of token rows, each calibrated as count 1 at length T (`curves_by_len`)
            "prefill_tokens": list(packed.tokens) if packed else None,
            "prefill_prompts": packed.prompts if packed else None,
            "serving_depth": 1,
            "input": "prompt ids in a device ring; continuous batching over a static KV cache",
        },
        curves_by_len=prefill,
    )
    return ex, reply


def _bucket_phases(phases: Phases, plan) -> Each:
    """Said as each prefill bucket is captured: the first apart (with a compile mode, the compile is in it).

    Why apart: on a cold GPU machine the 8B set-up's prefills took 119 s (session 51), and whether that was
    the one compile or the captures of its 23 buckets decides what to make faster.
    """

    def each(i: int, n: int, key: Any) -> None:
        if i == 0 and n > 1:
            what = "compiled and captured" if plan.compile_mode else "captured"
            phases.done(f"first prefill bucket {what}", f" ({key}, the largest of {n})")
        else:
            phases.tick(f"prefill bucket {i + 1} of {n} captured")

    return each


def _prepared(plan) -> str:
    """How a set-up phase prepared its steps, in words: compiled and captured, captured, or eager."""
    if not plan.graph:
        return "eager"
    return "compiled and captured" if plan.compile_mode else "captured"


def _check(req: SetupRequest, ex: SlotExecutor) -> dict[str, Any]:
    """Greedy tokens of a continuous batch against each request alone in fp32 (module docstring)."""
    k = CHECK_REQUESTS
    longest = max(req.seq_lens)
    ins = np.asarray([max(1, longest * (k - i) // k) for i in range(k)], dtype=np.int64)
    outs = np.asarray([2 + (CHECK_OUTPUT - 2) * i // (k - 1) for i in range(k)], dtype=np.int64)
    outs = np.minimum(outs, req.cache_len - ins)
    slots = min(2, max(req.buckets))  # two slots: the third request waits for a freed one
    # the step as prepared: over the smallest slot count set up with room for them, rows past two idle
    width = min(b for b in req.buckets if b >= slots)
    clock = VirtualClock()
    ex.set_level(width, ins, record=True)
    timed = Ticking(ex, clock, width)
    with torch.inference_mode():
        serve_continuous(np.arange(k) * 2.5e-3, ins, outs, slots, clock, timed)
    got = ex.record or {}
    # the same seeded weights in fp32 on the same device (TF32 off), freed after: the decode sweep's reference
    set_tf32("fp32")
    ref = build_llama(req.model, seed=req.seed, device=req.device)
    same = total = 0
    first_bad = None
    with torch.inference_mode():
        for r in range(k):
            want = generate(ref, ex.prompt(r, int(ins[r]))[None, :], int(outs[r]))[0].tolist()
            hits = [a == b for a, b in zip(got.get(r, []), want, strict=False)]
            same, total = same + sum(hits), total + len(want)
            if first_bad is None and (len(hits) < len(want) or not all(hits)):
                first_bad = r
    del ref
    set_tf32(req.precision)
    if ex.cuda:
        torch.cuda.empty_cache()
    ex.set_level(slots, ins)
    agreement = same / total if total else 0.0
    # an fp8 cache is held to fp8's bounds, as the sweep's rows are (`correctness.bounds_of`): its rounded K
    # and V may part a near-tie from fp32's tokens; only where the bounds are fp32's must every token agree
    bounds = bounds_of(req.precision, req.kv_cache)
    return {
        "top1_agreement": agreement,
        "n_images": total,
        "flagged": bounds in ("fp32", "tf32") and agreement < 1.0,
        "weights": "random",
        "reference": "fp32 decoder on the device, each request alone (greedy tokens)",
        "first_mismatch_request": first_bad,
        **({"bounds": bounds} if bounds != req.precision else {}),  # an fp8 cache: the precision held to
    }


class Ticking:
    """The executor with a virtual clock that ticks 1 ms per call (the check's interleaving)."""

    def __init__(self, ex: SlotExecutor, clock: VirtualClock, width: int | None = None) -> None:
        self.ex, self.clock, self.width = ex, clock, width

    def prefill(self, first: int, count: int, slots: list[int]) -> None:  # noqa: D102
        self.ex.prefill(first, count, slots)
        self.clock.advance(1e-3)

    def decode(self, active: np.ndarray) -> None:
        """One step; over ``width`` rows where set (the loop's slots first, the rest idle)."""
        if self.width is not None and self.width > len(active):
            active = np.concatenate([active, np.zeros(self.width - len(active), dtype=bool)])
        self.ex.decode(active)
        self.clock.advance(1e-3)


def _prefill_label(ex: SlotExecutor) -> str:
    """How admissions are prefilled, in words (`deepgap.serving.worker.llm_prefill`), and the row kernel where on."""
    how = _prefill_way(ex)
    if row_kernel_on(ex.model):  # `quant.row_quant`
        how += "; 8-bit inputs quantized by the row kernel (DEEPGAP_QUANT_ROW_QUANT=triton)"
    return how


def _prefill_way(ex: SlotExecutor) -> str:
    """Unpadded, packed or padded, and per bucket through a graph or eager."""
    if ex.prefills is None:
        return "eager, unpadded (DEEPGAP_SERVE_PREFILL=padded)"
    how = "cuda-graph" if ex.prefills.graph else "eager"
    if isinstance(ex.prefills, PackedPrefill):
        if ex.packed_how:
            how = f"{how}, {ex.packed_how},"
        return (
            f"packed (DEEPGAP_SERVE_PREFILL=packed): {how} per bucket of token rows "
            f"({'/'.join(map(str, ex.prefills.tokens))}; at most {ex.prefills.prompts} prompts a prefill, "
            "larger admissions split)"
        )
    return (
        f"padded (DEEPGAP_SERVE_PREFILL=padded): {how} per bucket (newcomers "
        f"{'/'.join(map(str, ex.prefills.counts))}, prompts padded to a multiple of {LENGTH_QUANTUM}; "
        "more newcomers: eager)"
    )


ZERO_ITERATIONS = 5  # steps timed with every slot at position 0: the median of a few is the line's other end


def calibration_position(req: SetupRequest) -> int:
    """Where every slot sits while the decode step is timed: the load's mean decode position, else mid-cache."""
    return req.decode_position or req.cache_len // 2


def _decode_curve(ex: SlotExecutor, req: SetupRequest):
    """Seconds of each decode step per slot count, all slots at the load's mean decode position.

    And the median with every slot at position 0 (``parts[s]["at_zero_s"]``), the other end of the simulator's
    line (`LlmService.decode_times`: a step's rows hold positions between, a free row's is 0).
    """
    samples: dict[int, list[float]] = {}
    parts: dict[int, dict[str, float]] = {}
    with torch.inference_mode(), quiet_gc():
        for s in req.buckets:
            active = np.zeros(s, dtype=bool)  # positions stay: every step reads the same cache rows
            ex.set_level(s, np.ones(1, dtype=np.int64))  # every position 0
            zero = _timed(lambda active=active: ex.decode(active), req.curve_warmup, ZERO_ITERATIONS)
            ex.pos[:s] = calibration_position(req)
            lat = _timed(lambda active=active: ex.decode(active), req.curve_warmup, req.curve_iterations)
            samples[s] = lat
            parts[s] = {
                "compute_s": float(np.mean(lat)),
                "interval_s": float(np.median(lat)),
                "at_zero_s": float(np.median(zero)),
            }
    return samples, parts  # each use after it sets a level, which puts every position back at 0


def _prefill_curve(ex: SlotExecutor, req: SetupRequest, length: int) -> dict[int, list[float]]:
    """Seconds of a prefill of ``b`` prompts of ``length`` tokens, per slot count and for one prompt.

    Why one prompt too: under Poisson arrivals most prefills admit a few prompts, and the simulator charges
    a batch below the smallest calibrated one that one's time (a 64-prompt prefill for one newcomer).
    Bucketed admissions (`deepgap.serving.worker.llm_prefill`) are calibrated at each bucket's count
    instead of at every slot count: a prefill of hundreds of prompts only happens once a server has fallen
    far behind, and past the largest bucket the simulator scales its time linearly (compute-bound). At 8B
    the slot counts' prefills cost about 100 s of set-up (2.8 s for 512 prompts of 192 tokens, 7 runs each).
    """
    out: dict[int, list[float]] = {}
    n = max(3, req.curve_iterations // 4)
    counts = {*ex.prefills.counts} if ex.prefills else {*req.buckets}
    with torch.inference_mode(), quiet_gc():
        for b in sorted({1, *counts}):
            ex.set_level(b, np.full(b, length, dtype=np.int64))
            slots = list(range(b))
            out[b] = _timed(lambda b=b, slots=slots: ex.prefill(0, b, slots), min(req.curve_warmup, 2), n)
    return out


def _packed_curve(
    ex: SlotExecutor, req: SetupRequest, packed: PackedPrefill, phases: Phases
) -> dict[int, dict[int, list[float]]]:
    """Seconds of each packed bucket's prefill, as ``{T: {1: samples}}``: the simulator reads ``prefill_s(1, T)``.

    Why count 1 at length ``T``: a packed prefill's work is its ``T`` token rows whatever prompts fill them
    (a replayed graph of fixed shape), so one curve over ``T`` is what `LlmService.admission_s` charges. Each
    bucket is timed full of prompts as long as the longest calibrated one (fewer rows where the slots or
    the gathered prompts run out; the graph's time is the same).
    """
    out: dict[int, dict[int, list[float]]] = {}
    n = max(3, req.curve_iterations // 4)
    longest = max(req.seq_lens)
    with torch.inference_mode(), quiet_gc():
        for i, t in enumerate(packed.tokens):
            phases.tick(f"prefill bucket {i + 1} of {len(packed.tokens)} ({t} token rows)")
            k = min(-(-t // longest), packed.prompts)
            lens = [min(longest, t // k)] * k
            ex.set_level(k, np.asarray(lens, dtype=np.int64))
            args = (t, list(range(k)), lens, list(range(k)))
            out[t] = {
                1: _timed(lambda args=args: (packed.run(*args), ex.sync()), min(req.curve_warmup, 2), n)
            }
    return out


def _timed(call, warmups: int, n: int) -> list[float]:
    """Seconds of each of ``n`` calls of ``call`` (which returns once the device is done), after ``warmups``."""
    for _ in range(warmups):
        call()
    clock = HostClock()
    return [clock.time_iteration(call) for _ in range(n)]


def run_llm_level(ex: SlotExecutor, req: LevelRequest) -> TokenLog:
    """One level on the wall clock: the requests' lengths, the policy's slots, the bounds' stop rule."""
    assert req.lengths is not None and req.out_lengths is not None
    slots = req.policy.max_batch
    ex.set_level(slots, req.lengths)
    stop = req.stop if isinstance(req.stop, SlotStop) else None
    with torch.inference_mode(), quiet_gc():
        clock = RealClock(time.perf_counter() + 0.005 if req.start_at is None else req.start_at)
        clock.sleep_until(0.0)
        return serve_continuous(req.arrivals_s, req.lengths, req.out_lengths, slots, clock, ex, stop)
