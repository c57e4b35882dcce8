"""MLPerf's BERT-99 beside bert-large at sequence 384 (issue 50: "beside MLPerf's 9,164, with the padding
difference named"): on the answer's throughput row of that model and length, on the GPU it was measured on
only, with its conditions and the padding said; nowhere else."""

from __future__ import annotations

import pytest
from fixtures_store import configurations, make_result

from deepgap.analysis import mlperf, prepare
from deepgap.core.records import ConfigSpec
from deepgap.store import Store

H200, OTHER = "Fixture H200", "Fixture GPU A"  # the anchor's GPU named (a fixture, not a measurement of one)


def _spec(model: str, seq: int, bs: int) -> ConfigSpec:
    return ConfigSpec(model=model, engine="eager", precision="fp16", batch_size=bs, device="cuda", resolution=seq,
                      seq_len=seq)  # fmt: skip


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("bert") / "bert.sqlite")
    s = Store(path)
    for gpu in (H200, OTHER):
        run = s.begin_run(
            {"device": "cuda"}, "deepgap run (fixture)", {"device_name": gpu, "device": "cuda"}, "0"
        )
        for model, seq in (("bert-large", 384), ("bert-large", 128), ("bert-base", 384)):
            for bs, ms in ((1, 2.0), (128, 40.0)):
                s.record(run, make_result(_spec(model, seq, bs), ms / 1e3))
        s.finish_run(run)
    s.close()
    st = Store(path, readonly=True)
    try:
        df = prepare(st.results_frame())
    finally:
        st.close()
    return df, configurations(path)


def test_the_anchor_stands_by_bert_large_at_384_on_its_gpu_only():
    (offline, server), why = mlperf.anchors_for("NVIDIA H200", "bert-large", 384)
    assert why == "" and (offline.value, server.value) == (9_164, 7_201)
    assert "padding removed" in offline.label() and "SQuAD v1.1" in offline.label()
    for args in (
        ("NVIDIA H200", "bert-large", 128),
        ("NVIDIA H200", "bert-base", 384),
        ("NVIDIA H100", "bert-large", 384),
    ):
        assert mlperf.anchors_for(*args)[0] == []
    # the ResNet-50 anchors stay the images' (no sequence): a text anchor never answers an image model
    assert [a.model for a in mlperf.anchors_for("NVIDIA H200", "resnet50")[0]] == ["resnet50"] * 3
    lines = mlperf.text_anchor_lines("NVIDIA H200", "bert-large", 384, 3_200.0)
    assert len(lines) == 2 and lines[0].endswith("this row is 0.35× of it in sequences/s")
    assert all("deepgap's rows are full 384-token sequences, none of it padding" in ln for ln in lines)
    assert (
        "×" not in mlperf.text_anchor_lines("NVIDIA H200", "bert-large", 384, float("nan"))[0].split("—")[-1]
    )


def test_the_answer_shows_it_beside_the_throughput_row_and_nowhere_else(frames):
    from deepgap.report.answer import answers

    df, agg = frames
    table, _ = answers(agg, df)
    with_anchor = table[table["also"].str.contains("MLPerf", na=False)]
    assert [tuple(r) for r in with_anchor[["platform", "model", "resolution", "goal"]].values] == [
        (H200, "bert-large", 384, "throughput")
    ]
    also = with_anchor.iloc[0]["also"]
    assert "9,164 samples/s" in also and "7,201 queries/s" in also and "padding removed" in also
    assert f"this row is {128 / 40e-3 / 9_164:.2f}× of it" in also


def test_a_packed_row_gets_bert_99_with_both_sides_lengths_and_a_padded_row_none():
    row = {
        "input_mode": "packed:uniform:32:320",
        "seq_len": 384,
        "throughput_ips": 7330.0,
        "tokens_per_sample": 176.0,
    }
    lines = mlperf.mode_anchor_lines(H200, "bert-large", row)
    assert len(lines) == 2 and all("padding removed on both sides" in line for line in lines)
    assert "this row's lengths uniform:32:320, mean 176.0 tokens" in lines[0]
    assert "9,164 samples/s" in lines[0] and "this row is 0.80× of it in sequences/s" in lines[0]
    assert "SQuAD v1.1" in lines[0] and "7,201" in lines[1] and "of it" not in lines[1]  # Server: no ratio
    assert mlperf.mode_anchor_lines(OTHER, "bert-large", row) == []  # not the GPU it was measured on
    assert mlperf.mode_anchor_lines(H200, "bert-large", {**row, "seq_len": 128}) == []
    assert mlperf.mode_anchor_lines(H200, "bert-large", {**row, "input_mode": "padded:uniform:32:320"}) == []
    assert mlperf.mode_note(row["input_mode"]).startswith("packed: sequences of mixed lengths")
    assert mlperf.mode_note("int8-resident") == mlperf.RESIDENT_NOTE


def _mixed_store(path: str, modes: tuple[str, ...]) -> str:
    s = Store(path)
    run = s.begin_run(
        {"device": "cuda"}, "deepgap run (fixture)", {"device_name": OTHER, "device": "cuda"}, "0"
    )
    for mode in modes:
        spec = ConfigSpec(model="bert-base", engine="eager", precision="fp16", batch_size=64, device="cuda",
                          resolution=128, seq_len=128, input_mode=mode)  # fmt: skip
        s.record(run, make_result(spec, 10e-3))
    s.finish_run(run)
    s.close()
    return path


def test_compare_lists_each_input_kind_under_its_own_note(tmp_path):
    """Both sides' packed rows under the packed note, then the padded rows under theirs (the notes came first,
    all of them, and the rows after, so B's padded row read as a packed one)."""
    from deepgap.report.compare_console import resident_lines

    a = configurations(
        _mixed_store(str(tmp_path / "a.sqlite"), ("packed:uniform:8:128", "padded:uniform:8:128"))
    )
    b = configurations(_mixed_store(str(tmp_path / "b.sqlite"), ("packed:uniform:8:128",)))
    lines = resident_lines([("A", a), ("B", b)])
    heads = [i for i, ln in enumerate(lines) if ln.startswith("rows of another input")]
    assert [lines[i].split("(")[1].split(":")[0] for i in heads] == ["packed", "padded"], lines
    packed, padded = lines[heads[0] + 1 : heads[1]], lines[heads[1] + 1 :]
    assert [ln[:2] for ln in packed] == ["A:", "B:"] and all("packed input" in ln for ln in packed), packed
    assert [ln[:2] for ln in padded] == ["A:"] and "padded input" in padded[0], padded


def test_show_gives_a_mixed_batch_its_longest_and_mean_length_and_never_cuts_its_input(tmp_path):
    """`show`'s seq column read 64 for a packed batch whose sequences averaged 42 tokens; and its engine cell,
    squeezed, was cut to "packed:uniform:8…"."""
    from clirun import deepgap_cli

    s = Store(str(tmp_path / "m.sqlite"))
    run = s.begin_run(
        {"device": "cuda"}, "deepgap run (fixture)", {"device_name": OTHER, "device": "cuda"}, "0"
    )
    for mode, extra in ((None, None), ("packed:uniform:8:128", {"text_batch": {"tokens_per_sample": 70.4}})):
        spec = ConfigSpec(model="bert-base", engine="eager", precision="fp16", batch_size=64, device="cuda",
                          resolution=128, seq_len=128, input_mode=mode)  # fmt: skip
        s.record(run, make_result(spec, 10e-3, extra=extra))
    s.finish_run(run)
    s.close()
    out = deepgap_cli("show", str(tmp_path / "m.sqlite")).stdout
    assert "≤128" in out and "mean 70" in out
    assert "packed:uniform:" in out and "…" not in out  # the engine's input folded over lines, never cut
