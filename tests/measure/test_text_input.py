"""Mixed-length text batches (issue 50): ``--inputs packed,padded --seq-len-dist …``, beside full sequences.

The key and plan (a text input names its lengths; an image model gets none), the batch's layout and its
seeded draw, the model's packed and padded paths against each sequence run alone, and a real CPU run of
tinybert through the CLI: the stored rows carry their real tokens and FLOPs, every view counts real tokens,
and the answer stays the full-length rows' with the mixed-length ones beside it, labelled.
"""

from __future__ import annotations

import io
import json
import sqlite3

import pandas as pd
import pytest
import torch
from clirun import deepgap_cli

from deepgap.core.records import (
    INPUT_MODES,
    TEXT_INPUTS,
    ConfigSpec,
    input_kind,
    input_lengths,
    input_mode_label,
    is_resident,
    spec_input_mode,
)
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.plan import expand
from deepgap.measure.models import text_batch
from deepgap.measure.models.bert import CONFIGS
from deepgap.measure.models.build import build_model

DIST = "uniform:5:64"
PACKED = f"packed:{DIST}"


# --- the key and the plan -----------------------------------------------------------------------------------
def test_a_text_input_names_its_lengths_in_the_key():
    assert TEXT_INPUTS == ("packed", "padded")
    assert ("default", "int8-resident", *TEXT_INPUTS) == INPUT_MODES
    assert (
        spec_input_mode("packed", DIST) == PACKED
        and spec_input_mode("int8-resident", DIST) == "int8-resident"
    )
    assert spec_input_mode("default", DIST) is None
    assert (input_kind(PACKED), input_lengths(PACKED)) == ("packed", DIST)
    assert (input_kind("int8-resident"), input_lengths("int8-resident")) == ("int8-resident", None)
    assert input_kind(None) == "default" and not is_resident(PACKED) and is_resident("int8-resident")
    assert input_mode_label(PACKED).startswith(f"lengths {DIST}, padding removed")
    spec = ConfigSpec("tinybert", "eager", "fp32", 4, "cpu", resolution=64, seq_len=64, input_mode=PACKED)
    assert ConfigSpec.from_key(spec.key) == spec and ConfigSpec.input_mode_of(spec.key) == PACKED
    other = ConfigSpec(
        "tinybert", "eager", "fp32", 4, "cpu", resolution=64, seq_len=64, input_mode="packed:8,64"
    )
    assert other.key != spec.key  # two distributions are two configurations


def test_the_plan_gives_text_inputs_to_text_models_only():
    spec = validate(
        SweepSpec(
            models=("tinybert", "tinycnn"),
            batch_sizes=(1, 4),
            device="cpu",
            seq_lens=(64,),
            inputs=("default", "packed", "padded"),
            seq_len_dist=DIST,
        )
    )
    plan = expand(spec, "cpu")
    got = {(c.model, c.input_mode) for c in plan}
    assert got == {
        ("tinybert", None),
        ("tinybert", PACKED),
        ("tinybert", f"padded:{DIST}"),
        ("tinycnn", None),
    }
    assert len(plan) == 8  # two batch sizes each


def test_a_config_file_takes_the_lengths(tmp_path):
    from deepgap.drive.presets import load_toml

    p = tmp_path / "sweep.toml"
    p.write_text(f'models = ["tinybert"]\ninputs = ["packed"]\nseq_len_dist = "{DIST}"\nseq_lens = [64]\n')
    spec = load_toml(str(p))
    assert (spec.inputs, spec.seq_len_dist) == (("packed",), DIST)


# --- the batch and the model ----------------------------------------------------------------------------------
def test_the_batch_is_seeded_and_its_reference_rows_do_not_depend_on_its_size():
    a, b = text_batch.make(PACKED, 12, 8), text_batch.make(PACKED, 12, 8)
    assert a == b and len(a.lengths) == 12 and all(5 <= n <= 64 for n in a.lengths)
    assert (
        text_batch.make(PACKED, 3, 8).lengths == a.lengths[:3] == text_batch.reference_lengths(PACKED, 8)[:3]
    )
    assert text_batch.make(PACKED, 20, 8).lengths[:8] == a.lengths[:8]
    assert a.tokens == sum(a.lengths) and a.tokens_per_sample == pytest.approx(a.tokens / 12)
    padded = text_batch.make(f"padded:{DIST}", 12, 8)
    assert padded.lengths == a.lengths and padded.computed_per_sample == a.longest
    assert a.computed_per_sample == a.tokens_per_sample
    with pytest.raises(ValueError):
        text_batch.make("int8-resident", 4, 8)


def test_the_layout_tensors_agree():
    b = text_batch.TextBatch("packed", (3, 1, 5))
    assert b.mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert b.index.tolist() == [0, 1, 2, 5, 10, 11, 12, 13, 14]
    assert b.positions.tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 4]
    assert b.cu_seqlens.tolist() == [0, 3, 4, 9] and b.cu_seqlens.dtype == torch.int32
    full = torch.arange(1, 19).reshape(3, 6)
    assert b.ids(full).tolist() == [[1, 2, 3, 0, 0], [7, 0, 0, 0, 0], [13, 14, 15, 16, 17]]


@pytest.mark.parametrize("mode", TEXT_INPUTS)
def test_the_packed_and_padded_model_give_each_sequence_its_own_output(mode):
    from deepgap.measure.models.bert_net import Packed

    torch.manual_seed(0)
    model = build_model("tinybert", 64, None, 0).eval()
    batch = text_batch.TextBatch(mode, (1, 64, 17, 40, 5))
    x = batch.ids(torch.randint(1, CONFIGS["tinybert"].vocab, (5, 64)))
    with torch.inference_mode():
        alone = torch.cat([model(x[i : i + 1, :n]) for i, n in enumerate(batch.lengths)])
        model.set_text_batch(batch)
        together = model(x)
        model.set_text_batch(None)
        full = model(x)
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(full, alone, atol=1e-3)  # cut sequences differ from padded ones read whole
    if mode == "packed":
        assert model.packed is None  # unset again
        assert Packed.kind("cpu", torch.float16) == Packed.PADDED  # varlen is a CUDA kernel


# --- a real run on the CPU, and every view of it ----------------------------------------------------------------
@pytest.fixture(scope="module")
def run_store(tmp_path_factory):
    store = str(tmp_path_factory.mktemp("text") / "s.sqlite")
    out = deepgap_cli(
        "run", "--models", "tinybert", "--device", "cpu", "--seq-lens", "64", "--batch-sizes", "4",
        "--inputs", "default,packed,padded", "--seq-len-dist", DIST, "--threads", "1",
        "--iterations", "5", "--repeats", "2", "--warmup", "1", "--store", store,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return store


def _rows(store: str) -> dict:
    con = sqlite3.connect(store)
    rows = con.execute(
        "SELECT config_key, status, throughput_ips, flops_per_image, extra_json FROM results"
    ).fetchall()
    con.close()
    return {ConfigSpec.input_mode_of(k): (s, tp, fl, json.loads(e or "{}")) for k, s, tp, fl, e in rows}


def test_the_rows_carry_their_real_tokens_flops_and_check(run_store):
    rows = _rows(run_store)
    assert set(rows) == {None, PACKED, f"padded:{DIST}"} and all(r[0] == "ok" for r in rows.values())
    batch = text_batch.make(PACKED, 4, 8)
    cfg = CONFIGS["tinybert"]
    full_flops = rows[None][2]
    for mode, per in (
        (PACKED, sum(map(cfg.flops, batch.lengths)) / 4),
        (f"padded:{DIST}", cfg.flops(batch.longest)),
    ):
        _, _, flops, extra = rows[mode]
        tb = extra["text_batch"]
        assert tb["lengths"] == DIST and tb["tokens_per_sample"] == pytest.approx(batch.tokens_per_sample)
        assert tb["longest"] == batch.longest
        assert flops == pytest.approx(full_flops * per / cfg.flops(64))
        assert extra["correctness"]["rel_l2"] < 1e-5  # against each sequence run alone, unpadded
    assert rows[PACKED][3]["text_batch"]["attention"] == "padded SDPA with a key mask"  # the CPU's fallback
    assert rows[PACKED][3]["text_batch"]["padded_tokens_per_sample"] == pytest.approx(batch.tokens_per_sample)
    assert rows[f"padded:{DIST}"][3]["text_batch"]["padded_tokens_per_sample"] == batch.longest
    assert "text_batch" not in rows[None][3]


def test_views_count_real_tokens_and_keep_the_answer_full_length(run_store, tmp_path):
    rows = _rows(run_store)
    mean = text_batch.make(PACKED, 4, 8).tokens_per_sample
    shown = json.loads(deepgap_cli("show", run_store, "--json").stdout)
    by_mode = {r["input_mode"]: r for r in shown}
    assert by_mode[PACKED]["tokens_per_sample"] == pytest.approx(mean)
    table = deepgap_cli("show", run_store).stdout
    assert f"{rows[PACKED][1] * mean:,.1f}" in table  # tokens/s: seq/s × real tokens, not × 64
    assert "padding removed" in table and "packed over padded" in table
    exported = pd.read_csv(io.StringIO(deepgap_cli("export", run_store, "-o", "-").stdout))
    assert exported["tokens_per_sample"].dropna().tolist() == pytest.approx([mean, mean])
    rec = deepgap_cli("recommend", run_store).stdout
    assert "1 candidate(s) checked" in rec and "packed input (mixed lengths" in rec  # beside it, not as it
    assert "bs4 1 thread seq 64 on" in rec  # the full-length row answers
    report = tmp_path / "r.html"
    assert deepgap_cli("report", run_store, "-o", str(report)).returncode == 0
    page = report.read_text()
    assert "not the answer: packed: sequences of mixed lengths" in page
    assert f"at mean length {mean:.1f} of seq 64" in page  # Table I's tokens/s says what a token is


@pytest.mark.parametrize("mode", TEXT_INPUTS)
@pytest.mark.parametrize("precision, bound", [("fp8", 0.1), ("int8", 0.05)])  # as full sequences
def test_the_quant_engines_linears_take_a_mixed_length_batch(mode, precision, bound):
    """Calibrated on full sequences (its layout set again after), then run on the batch: within the bound."""
    import copy

    from deepgap.measure.quant.transformer_engine import prepare_transformer

    model = build_model("tinybert", 32, None, 0).eval()
    batch = text_batch.TextBatch(mode, (7, 32, 1, 20))
    ids = batch.ids(torch.randint(1, 1000, (4, 32), generator=torch.Generator().manual_seed(4)))
    with torch.inference_mode():
        model.set_text_batch(batch)
        ref = model(ids)
        run, _, info = prepare_transformer(copy.deepcopy(model), precision, ids, "cpu", 1000, fast=False)
        out = run(ids)
    assert out.shape == ref.shape == (4, 32) and info["linears"] == 9
    assert float((out.float() - ref).norm() / ref.norm()) < bound
