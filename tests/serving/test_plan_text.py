"""``deepgap plan`` for a text encoder speaks in sequences/s and tokens/s, at one sequence length, and takes a
tokens/s target; bad input is one line and exit 2 (issue 50). The store is `fixtures_text`'s bert-base (GPU
at sequence 128 and 384, and its host CPU): milliseconds to write, a second of simulation per plan."""

from __future__ import annotations

import json
import math
import re

import pytest
from clirun import deepgap_cli
from fixtures_text import build_text_store

FAST = ("--slo-p99", "50ms", "--min-duration", "0.5s")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return build_text_store(str(tmp_path_factory.mktemp("plan") / "text.sqlite"))


def test_plan_of_a_text_model_says_sequences_and_tokens(store):
    p = deepgap_cli("plan", store, "--model", "bert-base", "--qps", "2000", "--seq-len", "128", *FAST)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "2,000 sequences/s of 128 tokens (256,000 tokens/s)" in out
    assert "capacity seq/s per" in out and "tokens/s per device" in out  # the table's two rate columns
    assert "tokens/s = seq/s × 128" in out and "seq/s at batch ≤" in out
    for word in ("queries/s", "img/s", "images/s", "top-1"):
        assert word not in out, word
    assert not re.search(r"(?<!se)q/s", out)  # no "q/s": every rate is seq/s


def test_plan_takes_a_tokens_target_and_reports_both_units_in_json(store):
    p = deepgap_cli(
        "plan", store, "--model", "bert-base", "--target-tok-s", "1e6", "--seq-len", "384", *FAST, "--json"
    )
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows and all(r["seq_len"] == 384 for r in rows)
    for r in rows:
        assert r["target_tokens_per_s"] == 1e6 and r["target_seq_per_s"] == pytest.approx(1e6 / 384)
        assert r["capacity_seq_per_s"] == r["capacity_qps"]
        assert r["capacity_tokens_per_s"] == pytest.approx(r["capacity_qps"] * 384)
        if r["capacity_qps"] > 0:
            assert r["devices"] == math.ceil(1e6 / 384 / r["capacity_qps"])


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "bert-base", "--qps", "100"], "curves are at sequence lengths 128, 384"),
        (
            ["--model", "bert-base", "--qps", "100", "--seq-len", "200"],
            "no curve of bert-base at sequence length 200",
        ),
        (
            ["--model", "bert-base", "--qps", "10", "--target-tok-s", "5", "--seq-len", "128"],
            "needs one target",
        ),
        (["--model", "bert-base", "--seq-len", "128"], "needs one target"),
        (["--model", "bert-base", "--target-tok-s", "-3", "--seq-len", "128"], "positive rate"),
        (["--model", "resnet50", "--qps", "10", "--seq-len", "128"], "--seq-len applies to text models"),
    ],
)
def test_plan_refuses_bad_text_input_in_one_line(store, args, needle):
    p = deepgap_cli("plan", store, *args, *FAST)
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
