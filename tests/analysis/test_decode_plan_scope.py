"""``plan --target-tok-s`` plans one workload: one input/output pair, and only the rows its flags allow.

Before: a store holding a decoder at 16/16 and 64/16 planned with the faster 16/16 row for a user whose
prompts are 64 tokens, and ``--engine``, ``--precision``, ``--platforms``, ``--max-batch`` and
``--objective watts`` were read and ignored. From the hand-built store of `fixtures_decode`.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from fixtures_decode import CPU, GPU, output_tok_s, write_decode_store

from deepgap.analysis.decode_plan import DecodeScope, plan_decode
from deepgap.cli import main

PLAN_8B = ["--model", "llama-3.1-8b", "--target-tok-s", "8000"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dec") / "s.sqlite")
    write_decode_store(path)
    return path


def _plan(store, capsys, *extra: str) -> tuple[int, str, str]:
    rc = main(["plan", store, *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err.strip()


def test_several_lengths_need_a_choice(store, capsys):
    # llama-3.2-1b: 128/128 on the GPU, 64/16 on the host CPU
    rc, _, err = _plan(store, capsys, "--model", "llama-3.2-1b", "--target-tok-s", "100")
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "several input/output lengths (64/16, 128/128)" in err and "--input-len 64 --output-len 16" in err
    rc, out, _ = _plan(store, capsys, "--model", "llama-3.2-1b", "--target-tok-s", "100", "--input-len", "64")
    assert rc == 0 and "llama-3.2-1b at 64 in / 16 out" in out
    assert CPU in out and GPU not in out and "128/128" not in out


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--input-len", "100"], "with --input-len 100 (input/output lengths stored: 128/128)"),
        (["--input-len", "0"], "--input-len must be at least 1"),
        (["--output-len", "many"], "output-len"),
        (["--precision", "int8"], "with --precision int8 (the stores hold: bf16, fp8)"),
        (["--engine", "quant", "--precision", "bf16"], "with --precision bf16 (the stores hold: fp8)"),
        (["--platforms", "B200"], "no platform 'B200'"),
        (["--max-batch", "0"], "--max-batch must be at least 1"),
        (["--seq-len", "128"], "pass --input-len and --output-len instead"),
        (["--objective", "cost"], "unknown --objective 'cost'"),
    ],
)
def test_bad_scope_is_one_line(store, capsys, extra, says):
    rc, _, err = _plan(store, capsys, *PLAN_8B, *extra)
    assert rc == 2 and says in err and len(err.splitlines()) == 1, err


def test_lengths_flags_belong_to_a_decoder(store, capsys):
    rc, _, err = _plan(
        store, capsys, "--model", "resnet50", "--qps", "10", "--slo-p99", "5ms", "--input-len", "8"
    )
    assert rc == 2 and "--input-len applies to a decoder's plan" in err, err


@pytest.mark.parametrize(
    ("extra", "chosen", "rate"),
    [
        ([], "eager bf16 bs8", output_tok_s(8, 4.1, 128)),  # the fastest that agrees with fp32
        (["--precision", "fp8"], "quant fp8 bs1", output_tok_s(1, 2.1, 128)),  # bs64 fp8 is flagged
        (["--engine", "eager", "--max-batch", "4"], "eager bf16 bs1", output_tok_s(1, 3.7, 128)),
        (["--max-batch", "4"], "quant fp8 bs1", output_tok_s(1, 2.1, 128)),
        (["--platforms", "H200"], "eager bf16 bs8", output_tok_s(8, 4.1, 128)),
    ],
)
def test_flags_narrow_the_rows(store, capsys, extra, chosen, rate):
    rc, out, err = _plan(store, capsys, *PLAN_8B, *extra)
    assert rc == 0, err
    assert f"{math.ceil(8000 / rate)} device(s) of {chosen} 128/128 at {rate:,.1f}" in out, out
    considered = [line for line in out.splitlines() if "considered:" in line]
    if "--max-batch" in extra:
        assert considered and not any(" bs8 " in c or " bs64 " in c for c in considered), considered


def _row(engine: str, bs: int, out_tok_s: float, j_per_token: float) -> dict:
    return {
        "model": "m", "engine": engine, "precision": "bf16", "batch_size": bs, "input_len": 128,
        "output_len": 128, "status": "ok", "logits_flagged": False, "output_tokens_per_s": out_tok_s,
        "decode_tokens_per_s": out_tok_s * 1.1, "joules_per_token": j_per_token, "tpot_tail_ms": 20.0,
        "tpot_tail_label": "p99 of n=381", "ttft_median_ms": 100.0, "device_name": GPU, "device": "cuda:0",
    }  # fmt: skip


def test_objective_watts_picks_the_fewest_watts_in_all():
    # fast: 1,000 tok/s at 1.1 kW a device → 10 devices, 11 kW; frugal: 400 tok/s at 44 W → 25 devices, 1.1 kW
    tab = pd.DataFrame([_row("fast", 64, 1000.0, 1.0), _row("frugal", 8, 400.0, 0.1)])
    (fewest,) = plan_decode(tab, "m", 10_000, 0.1, 2.0)
    assert (fewest.configuration, fewest.devices) == ("fast bf16 bs64 128/128", 10)
    (frugal,) = plan_decode(tab, "m", 10_000, 0.1, 2.0, DecodeScope(), "watts")
    assert (frugal.configuration, frugal.devices) == ("frugal bf16 bs8 128/128", 25)
    assert frugal.total_watts() == pytest.approx(25 * 0.1 * 440.0) and "the fewest watts in all" in frugal.why
    # no power measured: the fastest, saying why
    blind = pd.DataFrame([_row("fast", 64, 1000.0, math.nan), _row("frugal", 8, 400.0, math.nan)])
    (row,) = plan_decode(blind, "m", 10_000, 0.1, 2.0, DecodeScope(), "watts")
    assert row.configuration.startswith("fast") and "no power measured here" in row.why


@pytest.mark.parametrize("command", [["capacity"], ["plan", "--qps", "10"]])
def test_queries_per_second_of_a_decoder_point_to_its_own_commands(store, capsys, command):
    """`capacity`/`plan --qps` read batch curves of queries; of a decode store they said "run `deepgap run` first"."""
    rc = main([command[0], store, *command[1:], "--model", "llama-3.1-8b", "--slo-p99", "50ms"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "holds decode rows (llama-3.1-8b, llama-3.2-1b), not batch curves of queries" in err
    assert "deepgap plan STORE --model llama-3.1-8b --target-tok-s N" in err
