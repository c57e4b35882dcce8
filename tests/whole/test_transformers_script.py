"""benchmarks/transformers_preset.sh: its `deepgap run` arguments parse, validate and plan the preset its header
describes, on a GPU and for the CPU smoke (tinybert). Its DRY mode prints them; nothing runs here.
The smoke itself (SMOKE=1, real runs on a CPU) was run by hand: docs/transformers.md says how."""

from repo_paths import BENCHMARKS
from script_plan import dry_plan

SCRIPT = BENCHMARKS / "transformers_preset.sh"


def _plan(smoke: bool) -> list:
    return dry_plan(SCRIPT, ["preset", "gputests"], smoke, "/preset.sqlite")


def test_the_preset_step_plans_the_headline_configurations():
    got = {(c.model, c.engine, c.precision, c.batch_size, c.seq_len) for c in _plan(smoke=False)}
    shapes = [(m, s) for m in ("bert-base", "bert-large") for s in (128, 384)] + [("vit_b_16", None)]
    want = {(m, "eager", p, b, s) for m, s in shapes for p in ("fp32", "fp16") for b in (1, 256)}
    want |= {(m, "cudagraph", "fp16", 1, s) for m, s in shapes}
    want |= {(m, e, p, 256, s) for m, s in shapes for e, p in (("compile-freeze", "fp16"), ("quant", "fp8"))}
    assert got == want and len(got) == 35
    assert all(c.device == "cuda" for c in _plan(smoke=False))


def test_the_cpu_smoke_runs_the_same_step_with_tinybert():
    plan = _plan(smoke=True)
    assert {(c.model, c.seq_len) for c in plan if c.model == "tinybert"} == {
        ("tinybert", 16),
        ("tinybert", 32),
    }
    assert {c.model for c in plan} == {"tinybert", "tinycnn"}
    assert {c.engine for c in plan} == {"eager", "cudagraph", "compile-freeze", "quant"}
    assert all(c.device == "cpu" for c in plan)
