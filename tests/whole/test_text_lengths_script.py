"""benchmarks/text_lengths.sh: its `deepgap run` arguments parse, validate and plan the mixed-length rows its
header describes, on a GPU and for the CPU smoke (tinybert). Its DRY mode prints them; nothing runs here."""

from repo_paths import BENCHMARKS
from script_plan import dry_plan

SCRIPT = BENCHMARKS / "text_lengths.sh"


def _plan(smoke: bool) -> list:
    return dry_plan(SCRIPT, ["bertlarge", "loop", "serve", "bertbase", "gputests"], smoke, "/lengths.sqlite")


def test_the_step_plans_bert_large_over_three_inputs():
    got = {
        (c.model, c.engine, c.precision, c.batch_size, c.seq_len, c.input_mode) for c in _plan(smoke=False)
    }
    modes = (None, "packed:uniform:32:320", "padded:uniform:32:320")
    want = {
        ("bert-large", e, p, 256, 384, m)
        for e, p in (("compile-freeze", "fp16"), ("quant", "fp8"))
        for m in modes
    }
    assert got == want


def test_the_cpu_smoke_runs_the_same_step_with_tinybert():
    plan = _plan(smoke=True)
    assert {(c.model, c.seq_len, c.device) for c in plan} == {("tinybert", 64, "cpu")}
    assert {c.input_mode for c in plan} == {None, "packed:uniform:8:56", "padded:uniform:8:56"}
