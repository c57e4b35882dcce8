"""benchmarks/transformers_h100.sh: every step's `deepgap run` arguments parse, validate and plan what its
header says, for the H100 and for the CPU smoke (tinybert). Its DRY mode prints them; nothing runs here.
The smoke itself (SMOKE=1, real runs on a CPU) was run by hand: docs/transformers.md says how."""

import argparse
import os
import subprocess

from repo_paths import BENCHMARKS

from deepgap.commands.run import add_arguments, build_spec
from deepgap.drive.config import validate
from deepgap.drive.plan import expand

SCRIPT = BENCHMARKS / "transformers_h100.sh"
STEPS = ("bert-eager", "bert-base-compile", "bert-large-compile", "vit")


def _plans(smoke: bool) -> dict[str, list]:
    env = {**os.environ, "DRY": "1", "SMOKE": "1" if smoke else "0"}
    out = subprocess.run(
        ["bash", str(SCRIPT), *STEPS, "gputests"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=SCRIPT.parent.parent,
    ).stdout.splitlines()
    assert len(out) == len(STEPS)
    p = argparse.ArgumentParser()
    add_arguments(p)
    plans = {}
    for step, line in zip(STEPS, out, strict=True):
        args = p.parse_args(line.split())
        assert args.store.endswith(f"/{step}.sqlite")
        spec = validate(build_spec(args))
        plans[step] = expand(spec, spec.device)
    return plans


def test_the_h100_steps_plan_the_headline_configurations():
    plans = _plans(smoke=False)
    got = {
        step: {(c.model, c.engine, c.precision, c.batch_size, c.seq_len) for c in plan}
        for step, plan in plans.items()
    }
    bert = [(m, s) for m in ("bert-base", "bert-large") for s in (128, 384)]
    assert got["bert-eager"] == {
        (m, "eager", p, b, s) for m, s in bert for p in ("fp32", "fp16") for b in (1, 64, 256)
    } | {(m, "cudagraph", "fp16", 1, s) for m, s in bert}
    for step, model in (("bert-base-compile", "bert-base"), ("bert-large-compile", "bert-large")):
        assert got[step] == {(model, "compile-freeze", "fp16", b, s) for s in (128, 384) for b in (64, 256)}
    assert {(m, e, s) for m, e, _, _, s in got["vit"]} == {
        ("vit_b_16", e, None)
        for e in ("eager", "cudagraph", "compile-freeze", "quant")  # the preset's engines
    }
    assert all(c.device == "cuda" for plan in plans.values() for c in plan)


def test_the_cpu_smoke_runs_the_same_steps_with_tinybert():
    plans = _plans(smoke=True)
    assert {(c.model, c.seq_len) for c in plans["bert-eager"]} == {("tinybert", 16), ("tinybert", 32)}
    assert {c.engine for c in plans["bert-base-compile"]} == {"compile-freeze"}
    assert {c.model for c in plans["vit"]} == {"tinycnn"}
    assert all(c.device == "cpu" for plan in plans.values() for c in plan)
