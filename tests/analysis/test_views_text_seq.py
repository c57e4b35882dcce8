"""Text units in the views that still spoke of images (issue 49 item 6, issue 50 item 3), and sequence lengths apart.

Why a file beside `test_views_text_units.py`: that one holds a tinybert store at one length; a text
model measured at two lengths on a GPU and its host CPU (`fixtures_text`) showed what was left: the
answer said samples/s, mJ/sample and top-1; the speedup, energy and thread-scaling tables said images/s,
px and nchw (their frames carried no ``seq_len``); the figures drew one line through seq 128 and 384 and
set their bars on one label; `compare` said img/s, nchw, and printed two lengths as one row twice;
``compare --paper`` of a text store crashed. Each test reads one view; one page is built for the whole file.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd
import pytest
from clirun import deepgap_cli
from fixtures_store import configurations
from fixtures_text import IMAGE_WORDS, build_text_store

WORDS = (*IMAGE_WORDS, "samples/s", "mJ/sample")  # a text-only view names sequences, never samples


def _no_image_words(text: str, words: tuple[str, ...] = WORDS) -> None:
    found = [w for w in words if w in text]
    assert not found, f"image units on a text model: {found}"


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("text_seq")
    a = build_text_store(str(d / "a.sqlite"))
    b = build_text_store(str(d / "b.sqlite"), gpu="Fixture GPU B", scale=1.3, cpu=False)
    return {"a": a, "b": b, "dir": str(d)}


@pytest.fixture(scope="module")
def agg(stores) -> pd.DataFrame:
    return configurations(stores["a"])


def test_answer_says_seq_per_s_mj_per_sequence_and_output_agreement(stores, agg):
    from deepgap.report.answer import answers
    from deepgap.store import Store

    s = Store(stores["a"], readonly=True)
    try:
        df = s.results_frame()
    finally:
        s.close()
    from deepgap.analysis import prepare

    table, _ = answers(agg, prepare(df))
    text = " ".join(
        str(v) for v in table.drop(columns=["host_cpu_detail"], errors="ignore").to_numpy().ravel()
    )
    _no_image_words(text, (*WORDS, "J/img"))
    assert "seq/s at seq 128" in text and "mJ/sequence" in text and "mJ/token" in text
    assert "output agree" in text and "J/seq" in text
    detail = " ".join(map(str, table.get("host_cpu_detail", pd.Series(dtype=str)).dropna()))
    assert "J/sequence" in detail and "J/image" not in detail


@pytest.mark.parametrize("name", ["speedup_vs_fp32", "speedup_vs_cpu", "energy", "cpu_thread_scaling"])
def test_more_report_tables_use_text_units(agg, name):
    from deepgap.analysis import tables
    from deepgap.render.formatting import html_table

    frame = {
        "speedup_vs_fp32": tables.speedup_vs_fp32,
        "speedup_vs_cpu": tables.speedup_vs_cpu,
        "energy": tables.energy,
        "cpu_thread_scaling": tables.thread_scaling,
    }[name](agg)
    assert len(frame) and set(frame["seq_len"]) <= {128, 384}
    t = html_table(name, frame)
    _no_image_words(" ".join([t["title"], *t["headers"], *(c for r in t["rows"] for c in r["cells"])]))
    assert any("seq/s" in h for h in t["headers"])
    if name == "energy":
        assert "mJ/token" in t["headers"] and "per sequence" in t["title"]
    if name == "speedup_vs_cpu":  # a row per length the CPU measured too (the CPU: seq 128 only)
        assert sorted(set(frame["seq_len"])) == [128]


def test_figures_keep_sequence_lengths_apart(agg):
    from deepgap.analysis.efficiency import pareto
    from deepgap.render.style import overlay_facets, overlay_series
    from deepgap.report import core, figures_summary, interactive_bars

    for title, sub in overlay_facets(agg):
        assert sub["seq_len"].nunique() == 1 and f"seq {int(sub['seq_len'].iloc[0])}" in title
        for _, s in overlay_series(sub):
            assert s["batch_size"].is_unique  # a line never runs through two lengths
    par = pareto(agg)
    gpu16 = par[(par["device"] == "cuda") & (par["precision"] == "fp16") & par["on_frontier"]]
    assert set(gpu16["seq_len"]) == {128, 384}  # a frontier per length
    titles = [ax.get_title() for ax in figures_summary.pareto(par).pending().axes if ax.get_visible()]
    assert "Fixture GPU A — bert-base seq 384" in titles
    bars = core._latency_bars(agg)
    spec = interactive_bars.bars(bars, "latency_ms", "median latency (ms)")
    xs = {x for t in spec["data"] for x in t["x"]}
    assert {"bert-base seq 128 bs1", "bert-base seq 384 bs1"} <= xs


def test_compare_says_seq_per_s_and_shows_the_length(stores):
    r = deepgap_cli("compare", stores["a"], stores["b"])
    assert r.returncode == 0, r.stderr
    _no_image_words(r.stdout, ("img/s", "images/s", "nchw"))
    assert "A seq/s" in r.stdout and "seq len" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith("│ bert-base │ eager  │ fp16 │ 1 ")]
    assert len(rows) == 2 and {row.split("│")[5].strip() for row in rows} == {"128", "384"}
    paper = deepgap_cli("compare", "--paper", stores["a"])
    assert "Traceback" not in paper.stderr and "no model and precision in common" in paper.stdout


def test_recommend_names_the_agreement_once(stores):
    r = deepgap_cli("recommend", stores["a"])
    assert r.returncode == 0, r.stderr
    assert "from an output agreement with trained weights" in r.stdout
    assert "agreement agreement" not in r.stdout and "top-1" not in r.stdout


def test_the_page_of_a_text_store_names_no_image_unit(stores):
    """One build of the whole page: its visible text, every table and every figure's plotly spec."""
    from deepgap.report.page import write_report

    out = f"{stores['dir']}/r.html"
    write_report(stores["a"], out)
    page = Path(out).read_text(encoding="utf-8")
    specs = re.findall(r'class="plot-spec" data-target="plot-[^"]+">(.*?)</script>', page, re.S)
    body = re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", " ", body))
    text = text.split('id="appendix"')[0].split("The paper's training-step rows")[0]  # the paper's own tables
    _no_image_words(text, tuple(w for w in WORDS if w != "px"))
    assert not re.search(r"\bpx\b|\d+px", text)
    assert "output agreement against the FP32 reference" in text
    for spec in specs:
        _no_image_words(spec, tuple(w for w in WORDS if w != "px"))
