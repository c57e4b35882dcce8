"""``deepgap serve --kv-cache fp8``: a served decoder's cache as fp8 codes, named in every view of the run.

The flag takes one value per serve run (``auto``, the default, or ``fp8``), as serve takes one engine and
precision; it reaches the worker through the set-up request (`SetupRequest.kv_cache`, its `ConfigSpec`), the
worker's decoder stores e4m3 codes (`served_model`), its check is held to fp8's bounds as the sweep's rows are
(`correctness.bounds_of`), and the levels, curves, capacities, show, export and printed lines name the cache.
Cheap: llama-tiny on the CPU, one short level in this process; no wall-clock asserts.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from clirun import deepgap_cli
from conftest import inprocess_serving

from deepgap.core.errors import UsageError
from deepgap.serving.run.spec import ServeSpec, validate


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"kv_cache": "fp16"}, r"unknown KV cache 'fp16'; choose from auto, fp8 \(--kv-cache\)"),
        ({"model": "tinycnn", "kv_cache": "fp8"}, "--kv-cache fp8 applies to decoders .* tinycnn is not one"),
        (
            {"model": "tinybert", "kv_cache": "fp8"},
            "--kv-cache fp8 applies to decoders .* tinybert is not one",
        ),
        ({"model": "tinycnn", "kv_cache": "int8"}, "unknown KV cache 'int8'"),  # the value first, any model
    ],
)
def test_a_bad_kv_cache_is_refused_in_one_line(changes, needle):
    spec = ServeSpec(model="llama-tiny", device="cpu", qps=5.0).replace(**changes)
    with pytest.raises(UsageError, match=needle):
        validate(spec)


def test_each_kv_cache_is_accepted_for_a_decoder_and_auto_for_any_model():
    for kv in ("auto", "fp8"):
        assert validate(ServeSpec(model="llama-tiny", device="cpu", qps=5.0, kv_cache=kv)).kv_cache == kv
    assert validate(ServeSpec(model="tinycnn", device="cpu", qps=5.0)).kv_cache == "auto"


@pytest.mark.parametrize(
    "model, value, needle",
    [("llama-tiny", "e5m2", "unknown KV cache 'e5m2'"), ("tinycnn", "fp8", "applies to decoders")],
)
def test_cli_refuses_a_bad_kv_cache_with_exit_2_and_writes_nothing(tmp_path, model, value, needle):
    store = tmp_path / "never.sqlite"
    p = deepgap_cli(
        "serve", "--model", model, "--device", "cpu", "--qps", "5", "--kv-cache", value, "--store", str(store)
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and needle in p.stderr
    assert not store.exists() and not list(tmp_path.iterdir())


def test_the_setup_request_carries_the_cache_into_the_served_configuration():
    """ "fp8" reaches `SetupRequest.kv_cache` and its `ConfigSpec` (key and label); "auto" leaves both as before."""
    from deepgap.serving.run.prelude import warmup_configs
    from deepgap.serving.run.rows import setup_request

    spec = ServeSpec(
        model="llama-tiny", device="cpu", qps=5.0, input_len_dist="fixed:8", output_len_dist="fixed:4"
    )
    fp8 = setup_request(spec.replace(kv_cache="fp8"), "llama-tiny", "cpu")
    own = setup_request(spec, "llama-tiny", "cpu")
    assert (fp8.kv_cache, own.kv_cache) == ("fp8", None)
    assert fp8.config(2).kv_cache == "fp8" and '"kv_cache":"fp8"' in fp8.config(2).key
    assert "kv-fp8" in fp8.config(2).label() and "kv_cache" not in own.config(2).key
    assert fp8.config(2).key != own.config(2).key
    # the warm-up's load is the eager forward, which keeps no cache: its configurations name none
    assert all(c.kv_cache is None for c in warmup_configs(fp8))


@pytest.mark.parametrize(
    "precision,warm", [("fp8", "bf16"), ("int8", "bf16"), ("bf16", "bf16"), ("fp32", "fp32")]
)
def test_a_served_decoders_warm_up_is_a_load_eager_runs(precision, warm):
    """The thermal warm-up's configurations are ones the eager engine accepts: an 8-bit decoder warms up in bf16
    (session 49 on an H100: quant fp8's warm-up asked eager for fp8, was refused, and the curves ran cold)."""
    from deepgap.core.precision import DeviceCaps
    from deepgap.measure.engines import get_engine
    from deepgap.serving.run.prelude import warmup_configs
    from deepgap.serving.run.rows import setup_request

    spec = ServeSpec(
        model="llama-tiny", device="cpu", qps=5.0, input_len_dist="fixed:8", output_len_dist="fixed:4",
        engine="quant" if precision in ("fp8", "int8") else "eager", precision=precision, kv_cache="fp8",
    )  # fmt: skip
    configs = warmup_configs(setup_request(spec, "llama-tiny", "cpu"))
    eager = get_engine("eager")
    assert configs and {c.precision for c in configs} == {warm}
    assert all(
        c.engine == "eager" and eager.supports(c, DeviceCaps("cuda:0", "cuda", "gpu", (9, 0))) is None
        for c in configs
    )


def test_served_model_stores_fp8_codes_in_the_executors_cache():
    """The worker's decoder (`served_model`) allocates its slots' cache as e4m3 codes: a quarter of fp32's bytes."""
    from deepgap.measure.models.llama_cache import FP8_CODES
    from deepgap.serving.worker.llm_engines import served_model
    from deepgap.serving.worker.llm_executor import SlotExecutor

    caches = {}
    for kv in (None, "fp8"):
        m = served_model("llama-tiny", "fp32", 0, "cpu", kv)
        SlotExecutor(m, "cpu", 2, 16, 8, seed=0)
        caches[kv] = m.cache
    assert caches["fp8"].k[0].dtype == FP8_CODES and caches["fp8"].v[-1].dtype == FP8_CODES
    assert caches[None].k[0].dtype == torch.float32
    assert caches["fp8"].nbytes * 4 == caches[None].nbytes
    quant = served_model("llama-tiny", "fp8", 0, "cpu", "fp8")  # 8-bit Linears beside an fp8 cache
    assert quant.kv_codes == FP8_CODES


def test_an_fp8_cache_is_held_to_fp8s_bounds_as_the_sweeps_rows_are():
    from deepgap.measure.correctness import REL_L2_BOUND, bounds_of

    assert bounds_of("fp32", "fp8") == "fp8" and bounds_of("bf16", "fp8") == "fp8"
    assert bounds_of("fp32", None) == "fp32" and bounds_of("bf16") == "bf16"
    assert REL_L2_BOUND[bounds_of("int8", "fp8")] >= REL_L2_BOUND["fp8"]  # never tighter than the weights'


def test_serve_llama_tiny_with_an_fp8_cache_stores_and_names_it(tmp_path, monkeypatch):
    """One short level: its rows carry kv_cache "fp8", its cache was codes, its check passed under fp8's bounds,
    and the printed line, ``show`` and ``export`` say "fp8 KV cache"."""
    inprocess_serving(monkeypatch)
    store = str(tmp_path / "kv.sqlite")
    args = ["--model", "llama-tiny", "--device", "cpu", "--threads", "1", "--batch-sizes", "1,2"]
    args += ["--curve-iterations", "3", "--qps", "100", "--input-len-dist", "uniform:4:16"]
    args += ["--output-len-dist", "fixed:4", "--min-queries", "40", "--min-duration", "0.05s"]
    args += ["--slo-ttft", "5s", "--slo-tpot", "1s", "--kv-cache", "fp8", "--no-telemetry"]
    p = deepgap_cli("serve", *args, "--store", store)
    assert p.returncode == 0, p.stderr
    assert "server (in uniform:4:16, out fixed:4, 2 slots, fp8 KV cache)" in p.stdout
    assert "building llama-tiny (eager, fp32, fp8 KV cache)" in p.stderr
    from deepgap.serving.records.storage import curves_frame
    from deepgap.serving.show.tables import levels
    from deepgap.store import Store

    s = Store(store, readonly=True)
    try:
        lv, curves = levels(s), curves_frame(s)
        (settings,) = [r["spec"]["options"]["serve"] for r in s.runs()]
    finally:
        s.close()
    assert settings["kv_cache"] == "fp8" and list(lv["kv_cache"]) == ["fp8"]
    (d,) = list(lv["extra"])
    assert d.kv_cache == "fp8" and d.to_json()["kv_cache"] == "fp8"
    assert {c.kv_cache for c in curves["extra"]} == {"fp8"}
    # the cache as allocated: 3 rows (2 slots and the packed prefill's sink) × cache_len positions, 1 byte each
    from deepgap.measure.models.llama_config import SHAPES

    sh = SHAPES["llama-tiny"]
    info = d.engine_info
    assert info.get("kv_cache", "").startswith("fp8")
    assert info.get("kv_cache_bytes") == 2 * sh.layers * 3 * sh.kv_heads * info.get("cache_len") * sh.head_dim
    c = d.correctness
    assert c.flagged is False and c.get("bounds") == "fp8" and 0 < c.top1_agreement <= 1
    shown = deepgap_cli("show", store)
    assert shown.returncode == 0
    rows = [line.split("│") for line in shown.stdout.splitlines() if line.startswith("│")]
    prec = " ".join(r[4].strip() for r in rows if len(r) > 4).split()  # the decoders' "prec" column, wrapped
    assert " ".join(prec) == "fp32 · fp8 KV cache"
    engine = " ".join(r[3].strip() for r in rows if len(r) > 4).split()  # and its engine, with its admissions
    assert " ".join(engine) == "eager · eager admissions"
    csv = tmp_path / "kv.csv"
    assert deepgap_cli("export", store, "-o", str(csv)).returncode == 0
    ex = pd.read_csv(csv)
    assert list(ex["kv_cache"]) == ["fp8"] and list(ex.columns).index("kv_cache") == 5  # after precision
    from deepgap.serving.show.llm_tables import COLUMNS

    cells = dict(COLUMNS)
    row = {"precision": "fp32", "kv_cache": "fp8"}
    assert cells["prec"](row) == "fp32 · fp8 KV cache" and cells["prec"]({"precision": "fp32"}) == "fp32"


def test_a_decoders_capacity_row_names_its_fp8_cache_in_show():
    """A capacity of an fp8-cache server: ``kv_cache`` in its details, "fp8 KV cache" in its precision's cell."""
    from deepgap.serving.records.details import CapacityDetails
    from deepgap.serving.show.console import CAPACITY
    from deepgap.serving.show.tables import add_kv_cache

    frame = pd.DataFrame(
        {"precision": ["bf16", "bf16"], "extra": [CapacityDetails(kv_cache="fp8"), CapacityDetails()]}
    )
    add_kv_cache(frame)
    cell = dict(CAPACITY)["prec"]
    assert [cell(r) for r in frame.to_dict("records")] == ["bf16 · fp8 KV cache", "bf16"]
    plain = pd.DataFrame({"precision": ["bf16"], "extra": [CapacityDetails()]})
    add_kv_cache(plain)
    assert "kv_cache" not in plain  # a store served without the option keeps the frames it had
    assert json.dumps(CapacityDetails().to_json()) == "{}"


def test_a_served_decoders_engine_cell_names_how_its_admissions_prefilled():
    """`llm_tables.engine_cell`: compiled or eager admissions from the set-up's words; the engine alone without."""
    from deepgap.serving.show.llm_tables import engine_cell

    compiled = "packed (DEEPGAP_SERVE_PREFILL=packed): cuda-graph, compiled (default, token rows dynamic), per bucket"
    eager = "packed (DEEPGAP_SERVE_PREFILL=packed): cuda-graph per bucket of token rows (64/128)"
    assert engine_cell({"engine": "quant", "admissions": compiled}) == "quant · compiled admissions"
    assert engine_cell({"engine": "quant", "admissions": eager}) == "quant · eager admissions"
    assert engine_cell({"engine": "quant", "admissions": ""}) == "quant"  # a store before the words
    assert engine_cell({"engine": "quant"}) == "quant"
