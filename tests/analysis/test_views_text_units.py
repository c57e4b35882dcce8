"""Issue 49, item 6: text units everywhere for text models (seq/s, tokens/s, ms per sequence, J/token, seq len).

Why its own file: the answer headed bert-base right, and every other view (the `run` console, `show`,
`recommend`, Table I, Pareto, energy, configurations, the figures) said images/s, mJ/image, ``nchw`` and
top-1 of it. One store of a tiny BERT (two batches at sequence length 32, energy telemetry) written
through `Store.record` (milliseconds), read in this process; figures are checked as data (plotly specs,
matplotlib axes before rendering), no report is built.
"""

from __future__ import annotations

import pandas as pd
import pytest
from clirun import deepgap_cli
from fixtures_store import configurations, make_result

from deepgap.core.records import ConfigSpec
from deepgap.store import Store

ENERGY = {"telemetry": {"joules_per_image": 0.02, "mean_power_w": 100.0}}
IMAGE_WORDS = ("images/s", "img/s", "mJ/image", "per image", "top-1")


def _spec(bs: int) -> ConfigSpec:
    return ConfigSpec(
        model="tinybert",
        engine="eager",
        precision="fp32",
        batch_size=bs,
        device="cpu",
        resolution=32,
        seq_len=32,
    )


@pytest.fixture(scope="module")
def text_store(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("text") / "text.sqlite")
    s = Store(path)
    run = s.begin_run(
        {"device": "cpu"}, "deepgap run (fixture)", {"device_name": "Fixture CPU", "device": "cpu"}, "0"
    )
    for bs, ms in ((1, 2.0), (4, 5.0)):
        s.record(run, make_result(_spec(bs), ms / 1e3, extra=ENERGY))
    s.finish_run(run)
    s.close()
    return path


@pytest.fixture(scope="module")
def agg(text_store) -> pd.DataFrame:
    return configurations(text_store)


def _no_image_words(text: str) -> None:
    found = [w for w in IMAGE_WORDS if w in text]
    assert not found, f"image units on a text model: {found}"


def test_run_console_says_seq_and_tokens_per_s():
    from deepgap.core.events import Event
    from deepgap.drive.progress import result_line

    line = result_line(Event(0, 1, _spec(4), make_result(_spec(4), 5e-3)))
    assert "800.0 seq/s (25,600 tokens/s)" in line and "ms per sequence" in line
    # the median is the batch's latency: named so, with what it is a sequence (5 ms / 4)
    assert "median 5.000 ms per batch of 4 (1.2500 ms per sequence)" in line, line
    _no_image_words(line)


def test_show_uses_text_units(text_store):
    r = deepgap_cli("show", text_store)
    assert r.returncode == 0, r.stderr
    assert "seq/s" in r.stdout and "tokens/s" in r.stdout and "nchw" not in r.stdout
    _no_image_words(r.stdout)


def test_recommend_uses_text_units(text_store):
    for objective in ("throughput", "joules"):
        r = deepgap_cli("recommend", text_store, "--objective", objective)
        assert r.returncode == 0, r.stderr
        assert "seq/s" in r.stdout and "tokens/s" in r.stdout and "mJ/sequence" in r.stdout, r.stdout
        assert "mJ/token" in r.stdout and "(seq 32)" in r.stdout
        _no_image_words(r.stdout)
    # the fastest is batch 4: its median is the batch's, worded so (it once said "5.000 ms per sequence")
    r = deepgap_cli("recommend", text_store, "--objective", "throughput")
    assert "median 5.000 ms per batch of 4 (1.2500 ms per sequence)" in r.stdout, r.stdout


@pytest.mark.parametrize("name", ["table1_peak_throughput", "pareto_frontier", "energy", "configurations"])
def test_report_tables_use_text_units(agg, name):
    from deepgap.analysis.efficiency import pareto
    from deepgap.analysis.tables import table1
    from deepgap.render.formatting import html_table

    frame = {"table1_peak_throughput": table1(agg), "pareto_frontier": pareto(agg)}.get(name, agg)
    t = html_table(name, frame)
    text = " ".join([t["title"], *t["headers"], *(c for r in t["rows"] for c in r["cells"])])
    _no_image_words(text)
    assert "px" not in t["headers"] and "nchw" not in text
    assert any("seq/s" in h for h in t["headers"]) or name == "energy" and "seq/s/W" in t["headers"]
    if name == "energy":
        assert "mJ/sequence" in t["headers"] and "mJ/token" in t["headers"]
    if "seq len" in t["headers"]:
        assert {r["cells"][t["headers"].index("seq len")] for r in t["rows"]} == {"32"}


def test_figures_use_text_units(agg):
    from deepgap.analysis.efficiency import pareto
    from deepgap.render.draw import Figure
    from deepgap.report import core, figures_batch, figures_summary, interactive_pareto

    par = pareto(agg)
    spec = interactive_pareto.pareto(par)
    _no_image_words(str(spec))
    assert "seq/s" in str(spec)
    figs = [
        Figure(n, "t", "c", png=b"x")
        for n in ("fig06_throughput_vs_batch", "fig_perf_per_watt", "fig_joules_per_image")
    ]
    core._interactive(figs, agg, par, agg.iloc[0:0])
    for f in figs:
        _no_image_words(str(f.plotly))
    assert "mJ per sequence" in str(figs[2].plotly)
    # their matplotlib figures (what --static draws), not rendered
    captured = [f.pending() for f in (figures_summary.pareto(par), figures_batch.throughput_vs_batch(agg))]
    labels = [ax.get_ylabel() for fig in captured for ax in fig.axes if ax.get_ylabel()]
    assert labels and all(lab == "seq/s" for lab in labels), labels


def test_a_mixed_store_words_its_accuracy_once():
    """Images beside text: "top-1 or output agreement", not "top-1 or output agreement or output agreement"
    (a second replace ran over the first one's own "top-1"), in recommend's bar and the answer's header."""
    from deepgap.render.units import IMAGE, MIXED, TEXT

    text = "top-1 ≥ 99% (or from a top-1 agreement with trained weights); accuracy vs FP32 (top-1 on inputs)"
    assert MIXED.header(text) == (
        "top-1 or output agreement ≥ 99% (or from a top-1 or output agreement with trained weights); "
        "accuracy vs FP32 (top-1 or output agreement on inputs)"
    )
    assert TEXT.header(text).startswith("output agreement ≥ 99% (or from an output agreement with")
    assert IMAGE.header(text) == text
