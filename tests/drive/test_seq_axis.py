"""Sequence length as a sweep axis (issue 38): plan, key, store, resume, merge, validation, tokens/s, J/token.

Rows are written through `Store.record` (`fixtures_store.make_result`): milliseconds, no measurement.
"""

import json
import math

import pandas as pd
import pytest
from clirun import deepgap_cli
from fixtures_store import make_result

from deepgap.analysis import aggregate, config_label, prepare
from deepgap.analysis.tables import table1
from deepgap.core.records import ConfigSpec
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.plan import expand
from deepgap.drive.presets import load_toml, preset
from deepgap.store import Store

TEXT = dict(
    models=("tinybert", "tinycnn"),
    engines=("eager",),
    precisions=("fp32",),
    batch_sizes=(1, 2),
    device="cpu",
    seq_lens=(16, 32),
)


def test_plan_sweeps_seq_lens_for_text_models_only():
    plan = expand(validate(SweepSpec(**TEXT)), "cpu")
    text = [c for c in plan if c.model == "tinybert"]
    image = [c for c in plan if c.model == "tinycnn"]
    assert [(c.seq_len, c.resolution, c.batch_size) for c in text] == [
        (16, 16, 1),
        (16, 16, 2),
        (32, 32, 1),
        (32, 32, 2),
    ]
    assert {(c.seq_len, c.resolution) for c in image} == {(None, 32)}
    assert len({c.group for c in text}) == 2  # an OOM at seq 16 never skips seq 32's batches
    default = expand(validate(SweepSpec(**{**TEXT, "seq_lens": ()})), "cpu")
    assert {c.seq_len for c in default if c.model == "tinybert"} == {128}  # the model's default length
    fmts = expand(validate(SweepSpec(**{**TEXT, "memory_formats": ("nchw", "channels_last")})), "cpu")
    assert {c.memory_format for c in fmts if c.model == "tinybert"} == {"nchw"}  # no layout for token ids
    assert len([c for c in fmts if c.model == "tinybert"]) == 4


def test_image_keys_are_unchanged_and_text_keys_carry_the_seq_len():
    image = ConfigSpec("resnet50", "eager", "fp16", 8, "cuda")
    assert image.key == (
        '{"batch_size":8,"device":"cuda","engine":"eager","include_transfer":false,'
        '"memory_format":"nchw","model":"resnet50","precision":"fp16","resolution":224,'
        '"sweep":0,"threads":null}'
    )  # the key every stored run holds
    text = ConfigSpec("bert-base", "eager", "fp16", 8, "cuda", resolution=384, seq_len=384)
    assert json.loads(text.key)["seq_len"] == 384 and ConfigSpec.from_key(text.key) == text
    assert ConfigSpec.from_key(image.key) == image and ConfigSpec.seq_len_of(image.key) is None
    assert "seq384" in text.label() and "seq" not in image.label()


def test_seq_lens_from_toml_and_flags(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text('models = ["bert-base"]\nseq_lens = [128, 384]\n')
    assert load_toml(str(toml)).seq_lens == (128, 384)
    import argparse

    from deepgap.commands.run import add_arguments, build_spec

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert build_spec(p.parse_args(["--models", "bert-base", "--seq-lens", "128,384"])).seq_lens == (128, 384)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--models", "tinycnn", "--seq-lens", "128"], "--seq-lens applies to text models"),
        (["--models", "tinybert", "--seq-lens", "1024"], "longer than tinybert's 512 positions"),
        (["--models", "tinybert", "--seq-lens", "0"], "seq_lens has 0"),
        (["--models", "tinybert", "--seq-lens", "128,,384"], "has an empty item"),
    ],
)
def test_bad_seq_lens_exit_2_with_one_line_and_nothing_written(tmp_path, args, says):
    store = tmp_path / "s.sqlite"
    r = deepgap_cli("run", *args, "--device", "cpu", "--store", str(store), "--quiet")
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert not store.exists() and list(tmp_path.iterdir()) == []


def _store_with(path, specs, device="cpu"):
    s = Store(str(path))
    env = {"device_name": "Fixture CPU", "device": device}
    run = s.begin_run(SweepSpec(**TEXT).to_dict(), "test", env, "t")
    for i, spec in enumerate(specs):
        s.record(run, make_result(spec, 0.01 * (i + 1)))
    return s, run


def _text_specs():
    return [ConfigSpec("tinybert", "eager", "fp32", 2, "cpu", resolution=n, seq_len=n) for n in (16, 32)] + [
        ConfigSpec("tinycnn", "eager", "fp32", 2, "cpu", resolution=32)
    ]


def test_store_resume_and_merge_keep_the_axis(tmp_path):
    specs = _text_specs()
    s, run = _store_with(tmp_path / "a.sqlite", specs)
    try:
        assert s.done_keys(run) == {c.key for c in specs}  # resume skips exactly these
        stored = SweepSpec.from_dict(s.runs()[-1]["spec"])  # what --resume plans from
        assert stored.seq_lens == (16, 32)
        replanned = {c.key for c in expand(validate(stored.replace(batch_sizes=(2,))), "cpu")}
        assert s.done_keys(run) <= replanned  # the stored keys are the plan's: nothing measured twice
        assert s.result_configs(run) == specs
        df = s.results_frame()
        assert [None if v != v else v for v in df["seq_len"]] == [16, 32, None]
        assert list(df["resolution"]) == [16, 32, 32]
    finally:
        s.close()
    b, _ = _store_with(tmp_path / "b.sqlite", [specs[0]])
    b.close()
    out = tmp_path / "m.sqlite"
    merged = deepgap_cli("merge", str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite"), "-o", str(out))
    assert merged.returncode == 0, merged.stderr
    m = Store(str(out), readonly=True)
    try:
        df = m.results_frame()
        assert sorted((r.model, r.seq_len if r.seq_len == r.seq_len else 0) for r in df.itertuples()) == [
            ("tinybert", 16),
            ("tinybert", 16),
            ("tinybert", 32),
            ("tinycnn", 0),
        ]
    finally:
        m.close()


def test_tokens_per_s_and_joules_per_token_from_the_same_window():
    """Synthetic rows: tokens/s = samples/s × seq; J/token = J/sample ÷ seq (one window); images: NaN."""
    specs = _text_specs()
    rows = []
    for spec, ips, jps in zip(specs, (400.0, 150.0, 900.0), (0.02, 0.05, 0.01), strict=True):
        r = make_result(spec, 2 / ips, extra={"telemetry": {"joules_per_image": jps}})
        rows.append(
            {
                **{
                    k: getattr(spec, k)
                    for k in (
                        "model",
                        "engine",
                        "precision",
                        "batch_size",
                        "device",
                        "memory_format",
                        "threads",
                        "resolution",
                        "include_transfer",
                        "seq_len",
                    )
                },
                "status": "ok",
                "throughput_ips": r.throughput_ips,
                "throughput_ci_low_ips": r.throughput_ci_low_ips,
                "throughput_ci_high_ips": r.throughput_ci_high_ips,
                "latency_median_s": r.latency.median_s,
                "latency_p99_s": r.latency.p99_s,
                "ci_met": 1,
                "extra": r.details,
                "run_id": "r",
                "result_id": len(rows),
                "device_name": "Fixture CPU",
            }
        )
    df = prepare(pd.DataFrame(rows))
    assert list(df["seq_len"]) == [16, 32, 0]
    assert list(df["tokens_per_s"].iloc[:2]) == pytest.approx([400 * 16, 150 * 32])
    assert df["joules_per_token"].iloc[0] == pytest.approx(0.02 / 16)
    assert math.isnan(df["tokens_per_s"].iloc[2])
    assert math.isnan(df["joules_per_token"].iloc[2])
    agg = aggregate(df)
    assert len(agg) == 3  # seq 16 and 32 are two configurations
    t = agg.set_index(["model", "seq_len"])
    row = t.loc[("tinybert", 32)]
    assert row["tokens_per_s"] == pytest.approx(row["throughput_ips"] * 32)
    assert t.loc[("tinybert", 16), "joules_per_token"] == pytest.approx(0.02 / 16)
    assert config_label(agg[agg["seq_len"] == 16].iloc[0]).count("seq 16") == 1
    peak = table1(agg)
    assert sorted(zip(peak["model"], peak["seq_len"], strict=True)) == [
        ("tinybert", 16),
        ("tinybert", 32),
        ("tinycnn", 0),
    ]
    from deepgap.render.formatting import fmt_tokens

    by = {r["seq_len"]: r for r in peak.to_dict("records")}
    assert fmt_tokens(by[16]) == "6,400.0 at seq 16" and fmt_tokens(by[0]) == ""
    from deepgap.report.answer import answers

    ans = answers(agg, df)[0].set_index(["model", "resolution", "goal"])
    assert ans.loc[("tinybert", 16, "throughput"), "value"] == "6,400.0 tokens/s"
    assert "400.0 seq/s at seq 16" in ans.loc[("tinybert", 16, "throughput"), "also"]
    assert ans.loc[("tinybert", 16, "per joule"), "value"] == f"{0.02 / 16 * 1e3:.3g} mJ/token"
    assert ans.loc[("tinycnn", 32, "throughput"), "value"].endswith("img/s")  # image models unchanged


def test_show_prints_tokens_per_s_for_text_rows(tmp_path):
    s, _ = _store_with(tmp_path / "a.sqlite", _text_specs())
    s.close()
    r = deepgap_cli("show", str(tmp_path / "a.sqlite"))
    assert r.returncode == 0 and "tokens/s" in r.stdout
    ips = 2 / 0.01  # the first row: batch 2 at 10 ms, seq 16
    assert f"{ips * 16:,.1f}" in r.stdout, r.stdout
    rec = deepgap_cli("recommend", str(tmp_path / "a.sqlite"))
    assert "tinybert (seq 16)" in rec.stdout and "tinycnn (32px)" in rec.stdout, rec.stdout + rec.stderr


def test_transformers_preset_says_what_it_adds():
    from deepgap.drive.presets import PRESETS

    spec = validate(preset("transformers").replace(device="cuda"))
    plan = expand(spec, "cuda")
    seqs = {(c.model, c.seq_len) for c in plan}
    assert seqs == {
        ("bert-base", 128),
        ("bert-base", 384),
        ("bert-large", 128),
        ("bert-large", 384),
        ("vit_b_16", None),
    }
    by_engine = {e: {(c.precision, c.batch_size) for c in plan if c.engine == e} for e in spec.engines}
    assert by_engine == {
        "eager": {(p, b) for p in ("fp32", "fp16") for b in (1, 256)},
        "cudagraph": {("fp16", 1)},
        "compile-freeze": {("fp16", 256)},
        "quant": {("fp8", 256)},
    }
    text = PRESETS["transformers"][0]
    words = (
        "bert-base",
        "bert-large",
        "128",
        "384",
        "vit_b_16",
        "compile-freeze",
        "cudagraph",
        "quant fp8",
        "35 ",
    )
    assert all(w in text for w in words)
    assert len(plan) == 5 * (4 + 1 + 1 + 1) == 35  # the count the description gives


def test_serve_checks_a_text_models_lengths_before_anything_runs(tmp_path):
    """Text serving itself: tests/serving/test_serving_text.py; here, a length past tinybert's positions."""
    store = tmp_path / "s.sqlite"
    args = ("--model", "tinybert", "--device", "cpu", "--qps", "10", "--seq-len-dist", "uniform:16:1024")
    r = deepgap_cli("serve", *args, "--store", str(store))
    assert r.returncode == 2 and "outside the model's 1..512 positions" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not store.exists()
    listed = deepgap_cli("list", "models")
    assert listed.returncode == 0 and "seq 128" in listed.stdout and "bert-large" in listed.stdout
