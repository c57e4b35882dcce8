"""Sweep expansion: engines paired with the precisions they run, per-engine axes, the default GPU grid."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepgap.cli import main
from deepgap.commands.run import add_arguments, build_spec
from deepgap.core.errors import UsageError
from deepgap.core.precision import PRECISIONS
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.plan import expand
from deepgap.drive.presets import default_spec, load_toml
from deepgap.measure.engines import ENGINES, load_engines
from deepgap.measure.pairing import check_pairs, engine_precisions

load_engines()
ALL_ENGINES = tuple(ENGINES.names())
ENGINES_OF_THE_GRID = ("eager", "cudagraph", "compile-freeze", "quant")


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


@settings(max_examples=60, deadline=None)
@given(
    engines=st.lists(st.sampled_from(ALL_ENGINES), min_size=1, max_size=4, unique=True),
    precisions=st.lists(st.sampled_from(list(PRECISIONS)), min_size=1, max_size=4, unique=True),
)
def test_every_row_is_a_pair_the_engine_runs_and_every_runnable_pair_is_a_row(engines, precisions):
    spec = SweepSpec(
        models=("resnet18",), engines=tuple(engines), precisions=tuple(precisions), batch_sizes=(1, 4)
    )
    runnable = {(e, p) for e in engines for p in precisions if p in engine_precisions(e)}
    orphan = [p for p in precisions if not any(p in engine_precisions(e) for e in engines)]
    idle = [e for e in engines if not any(p in engine_precisions(e) for p in precisions)]
    if orphan or idle:
        with pytest.raises(UsageError):
            expand(spec, "cuda")
        return
    rows = expand(spec, "cuda")
    assert {(c.engine, c.precision) for c in rows} == runnable
    assert len(rows) == 2 * len(runnable)


def test_the_issue_example_has_no_impossible_rows():
    spec = SweepSpec(
        models=("resnet50",),
        engines=("compile-freeze", "quant"),
        precisions=("fp16", "int8", "fp8"),
        batch_sizes=(1, 256),
        memory_formats=("channels_last",),
    )
    rows = expand(validate(spec), "cuda")
    assert sorted({(c.engine, c.precision) for c in rows}) == [
        ("compile-freeze", "fp16"),
        ("quant", "fp8"),
        ("quant", "int8"),
    ]
    assert len(rows) == 6  # 12 before, 8 of them "does not run" skips


@pytest.mark.parametrize(
    "argv,expect",
    [
        (["--engines", "eager", "--precisions", "fp32,int8"], "no chosen engine runs int8"),
        (
            ["--engines", "eager,quant", "--precisions", "fp16"],
            "engine quant runs none of the chosen precisions",
        ),
    ],
)
def test_unpaired_precision_or_engine_is_one_usage_error(argv, expect, tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    rc = main(["run", "--models", "tinycnn", "--device", "cpu", "--store", str(store), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and len(err.strip().splitlines()) == 1
    assert not store.exists() and not list(tmp_path.iterdir())


def test_default_gpu_grid():
    """Eager fp32/fp16 NCHW (the paper's baseline) beside cudagraph, compile-freeze and quant, twice."""
    spec = validate(default_spec(True, 16))
    rows = [c for c in expand(spec, "cuda") if c.device == "cuda"]  # the CPU's part: test_cpu_baseline.py
    assert spec.sweeps == 2 and spec.thermal_warmup and spec.thermal_timeout_s <= 120
    pairs = {(c.engine, c.precision, c.memory_format) for c in rows}
    assert pairs == {
        ("eager", "fp32", "nchw"),
        ("eager", "fp16", "nchw"),
        ("cudagraph", "fp16", "channels_last"),
        ("compile-freeze", "fp16", "channels_last"),
        ("quant", "int8", "channels_last"),
        ("quant", "fp8", "channels_last"),
    }
    for c in rows:
        assert c.precision in engine_precisions(c.engine)
    assert {c.model for c in rows} == {"resnet18", "resnet50", "resnet101"}
    per_sweep = [c for c in rows if c.sweep == 0]
    assert len(per_sweep) * 2 == len(rows) == 56
    compiled = [c for c in per_sweep if c.engine == "compile-freeze"]
    assert [c.model for c in compiled] == ["resnet50"]  # ~20 s of compilation each: one model, one batch
    batches = {e: {c.batch_size for c in rows if c.engine == e} for e in ENGINES_OF_THE_GRID}
    # quant at 1024, not 256 (issue 47: the answer shows ResNet-50's best quant throughput at a batch <= 1024)
    assert batches == {"eager": {1, 256}, "cudagraph": {1}, "compile-freeze": {256}, "quant": {1, 1024}}
    for m in ("resnet18", "resnet50", "resnet101"):  # every model and precision of quant at both batches
        quant = [(c.precision, c.batch_size) for c in per_sweep if c.engine == "quant" and c.model == m]
        assert sorted(quant) == [("fp8", 1), ("fp8", 1024), ("int8", 1), ("int8", 1024)]
    # a configuration group's batches stay together and ascend (the OOM cascade needs it); sweeps are
    # outermost (each in its own worker process); the later sweep's group order is shuffled, reproducibly
    assert [c.sweep for c in rows] == sorted(c.sweep for c in rows)
    group = lambda c: (c.precision, c.model, c.memory_format, c.engine, c.threads)  # noqa: E731
    orders = [[group(c) for c in rows if c.sweep == s] for s in (0, 1)]
    firsts = [list(dict.fromkeys(o)) for o in orders]
    assert sorted(firsts[0]) == sorted(firsts[1]) and firsts[0] != firsts[1]
    assert [(c.model, c.engine, c.batch_size) for c in expand(spec, "cuda") if c.device == "cuda"] == [
        (c.model, c.engine, c.batch_size) for c in rows
    ]
    for c0, c1 in zip(rows, rows[1:], strict=False):
        if group(c0) == group(c1) and c0.sweep == c1.sweep:
            assert c0.batch_size < c1.batch_size
    keys = [(*group(c), c.sweep) for c in rows]
    seen, last = set(), None
    for k in keys:
        if k != last:
            assert k not in seen, f"{k} split"
            seen.add(k)
            last = k


def test_an_axis_flag_replaces_the_presets_per_engine_axis():
    spec = build_spec(_args("--preset", "gpu", "--batch-sizes", "8", "--no-cpu-baseline"))
    assert {c.batch_size for c in expand(validate(spec), "cuda")} == {8}
    spec = build_spec(_args("--preset", "gpu", "--memory-formats", "nchw", "--no-cpu-baseline"))
    assert {c.memory_format for c in expand(validate(spec), "cuda")} == {"nchw"}
    spec = build_spec(
        _args("--preset", "gpu", "--engines", "quant", "--precisions", "int8", "--no-cpu-baseline")
    )
    rows = expand(validate(spec), "cuda")
    assert {(c.engine, c.precision, c.memory_format) for c in rows} == {("quant", "int8", "channels_last")}
    assert {c.batch_size for c in rows} == {1, 1024}  # the preset's quant batch sizes stay


def test_the_gpu_preset_compiles_one_model_and_a_models_flag_lifts_it():
    rows = expand(validate(build_spec(_args("--preset", "gpu", "--no-cpu-baseline"))), "cuda")
    assert {c.model for c in rows if c.engine == "compile-freeze"} == {"resnet50"}
    assert {c.model for c in rows if c.engine == "quant"} == {"resnet18", "resnet50", "resnet101"}
    assert {c.batch_size for c in rows if c.engine == "eager"} == {1, 256}
    assert len(rows) == 56  # 28 configurations in each of 2 sweeps
    spec = build_spec(_args("--preset", "gpu", "--models", "resnet18", "--no-cpu-baseline"))
    assert {(c.engine, c.model) for c in expand(validate(spec), "cuda") if c.engine == "compile-freeze"} == {
        ("compile-freeze", "resnet18")
    }


def test_an_engines_models_must_be_the_sweeps_own(tmp_path):
    f = tmp_path / "s.toml"
    base = 'models = ["resnet18", "resnet50"]\nengines = ["eager", "quant"]\nprecisions = ["fp16", "int8"]\n'
    f.write_text(base + '[engine_axes.quant]\nmodels = ["resnet50"]\n')
    rows = expand(validate(load_toml(str(f))), "cuda")
    assert {(c.engine, c.model) for c in rows} == {
        ("eager", "resnet18"), ("eager", "resnet50"), ("quant", "resnet50"),
    }  # fmt: skip
    for bad in ('["resnet101"]', "[]"):
        f.write_text(base + f"[engine_axes.quant]\nmodels = {bad}\n")
        with pytest.raises(UsageError, match="engine_axes.quant.models"):
            validate(load_toml(str(f)))


def test_engine_axes_from_toml_round_trip_and_errors(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(
        'engines = ["eager", "quant"]\nprecisions = ["fp16", "int8"]\nbatch_sizes = [1, 8]\n'
        "[engine_axes.quant]\nbatch_sizes = [256]\n"
    )
    spec = validate(load_toml(str(f)))
    rows = expand(spec, "cuda")
    assert {(c.engine, c.batch_size) for c in rows} == {("eager", 1), ("eager", 8), ("quant", 256)}
    again = SweepSpec.from_dict(spec.to_dict())  # how a resumed run rebuilds its spec
    assert expand(validate(again), "cuda") == rows
    for bad, msg in [
        ("[engine_axes.quant]\nthreads = [1]\n", "unknown axis"),
        ("[engine_axes.nosuch]\nbatch_sizes = [1]\n", "nosuch"),
        ('[engine_axes.quant]\nmemory_formats = ["nhwc"]\n', "memory_formats"),
        ("[engine_axes.quant]\nbatch_sizes = [0]\n", "positive"),
    ]:
        f.write_text('engines = ["quant"]\nprecisions = ["int8"]\n' + bad)
        with pytest.raises(UsageError, match=msg):
            validate(load_toml(str(f)))


def test_check_pairs_names_the_engines_that_can():
    with pytest.raises(UsageError) as e:
        check_pairs(SweepSpec(engines=("eager",), precisions=("fp8",)))
    assert "quant" in e.value.fix
