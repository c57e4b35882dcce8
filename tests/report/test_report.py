"""`deepgap report`: fixture store → self-contained HTML, tables, figures, flags; bad input writes nothing."""

import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from fixtures_store import build_store

from deepgap.cli import main
from deepgap.report.page import TABLE_SPECS, write_report
from deepgap.report.sections import table_specs
from deepgap.store.paths import OWNED

FIGURES = [
    "fig05_thermal_timeline",
    "fig06_throughput_vs_batch",
    "fig07_median_latency",
    "fig08_latency_vs_batch",
    "fig09_memory_vs_batch",
    "fig10_pareto",
    "fig11_speedup_vs_fp32",
    "fig_perf_per_watt",
    "fig_joules_per_image",
    "fig_speedup_vs_cpu",
    "fig_cpu_thread_scaling",
    "fig_roofline_inference",  # deepgap.roofline.report_section
    "fig_roofline_paper",
]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    d = tmp_path_factory.mktemp("rep")
    store = str(d / "fx.sqlite")
    runs = build_store(store)
    html = str(d / "out" / "report.html")
    paths = write_report(store, html)
    return {
        "store": store,
        "runs": runs,
        "html": html,
        "paths": paths,
        "text": Path(html).read_text(encoding="utf-8"),
    }


def test_sections_keep_the_page_order_and_leave_no_global_state(full):
    """The registered sections (core, serving, roofline, platforms) build the page in the order it had
    when report.py called them itself; their table specs travel with the build, not in globals."""
    ids = re.findall(r'id="([a-z0-9_]+)"', full["text"])
    assert [i for i in ids if i in FIGURES] == FIGURES
    assert [i for i in ids if i in table_specs()] == [
        "table1_peak_throughput",
        "paper_comparison",
        "speedup_vs_cpu",
        "speedup_vs_fp32",
        "pareto_frontier",
        "energy",
        "cpu_thread_scaling",
        "configurations",
        "failures",
        "thermal_state",
        "roofline_paper_reference",
    ]
    assert not [k for k in TABLE_SPECS if k.startswith(("roofline_", "serving_", "platforms_"))]


def test_every_figure_and_table_is_written(full):
    files = os.path.join(os.path.dirname(full["html"]), "report_files")
    names = sorted(n for n in os.listdir(files) if n != OWNED)  # the marker says deepgap made the folder
    assert OWNED in os.listdir(files)
    plots = re.findall(r'<div class="plot" id="plot-([^"]+)"></div>', full["text"])
    # a figure drawn with plotly has no PNG (issue 49: matplotlib was ~60% of a build); the others do
    assert [n for n in names if n.endswith(".png")] == sorted(f + ".png" for f in FIGURES if f not in plots)
    csvs = {n[:-4] for n in names if n.endswith(".csv")}
    sections = ("roofline_", "serving_", "platforms_")  # a section registers its tables when built
    core = {k for k in TABLE_SPECS if not k.startswith(sections)}
    extra = {"measurements", "environment", "answer", "how_sure"}
    assert core | extra | {"roofline_paper_reference"} <= csvs
    assert csvs <= set(table_specs()) | extra  # every section's declared tables
    assert full["paths"][0] == os.path.abspath(full["html"]) and len(full["paths"]) == 1 + len(names)
    # each figure on the page once: an embedded PNG, or an interactive plot that says where its image is
    imgs = len(re.findall(r'<img alt="[^"]*" src="data:image/png;base64,', full["text"]))
    assert imgs + len(plots) == len(FIGURES) and len(plots) >= 5
    assert full["text"].count("As an image: <code>deepgap report --static</code>.") == len(plots)
    noscript = re.search(r"<noscript>(.*?)</noscript>", full["text"], re.S).group(1)
    assert "<code>deepgap report --static</code> gives them as images" in noscript
    assert ".png" not in full["text"].split('id="figures"')[1].split('id="appendix"')[0]  # no PNG named
    for f in FIGURES:
        if f not in plots:
            with open(os.path.join(files, f + ".png"), "rb") as fh:
                assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_self_contained_no_external_urls(full):
    assert not re.search(r"<script[^>]*\bsrc=", full["text"])  # the page's scripts are inline
    # plotly.js names URLs it never loads: the rest of the page must name none
    text = re.sub(r"<script\b.*?</script>", "", full["text"], flags=re.S)
    assert not re.search(r"(?i)https?://", text)
    assert not re.search(r'(?i)(src|href)\s*=\s*"(//|[a-z]+:(?!image/png;base64))', text)
    assert not re.search(r"(?i)<script|<link|@import|url\(", text)
    # no relative link at all: the page alone is the report (its _files folder may stay behind)
    assert [u for u in re.findall(r'(?:href|src)="([^"#][^"]*)"', text) if not u.startswith("data:")] == []


def test_table1_environment_and_configurations(full):
    text = full["text"]
    assert "Table I — peak throughput per platform, model and precision" in text
    # the int8 peak is bs32 (bs128 has wrong outputs), with its CI, runs and full configuration
    assert "resnet18 eager int8 bs32 224px on Fixture GPU A (cuda)" in text and "16,000.0" in text
    t1 = pd.read_csv(
        os.path.join(os.path.dirname(full["html"]), "report_files", "table1_peak_throughput.csv")
    )
    assert len(t1) == 7 and {"batch_size", "throughput_ci_low_ips", "n_measurements", "n_runs"} <= set(
        t1.columns
    )
    row = t1[(t1["model"] == "resnet18") & (t1["precision"] == "int8")].iloc[0]
    assert row["batch_size"] == 32 and row["run_ids"] == full["runs"]["gpu"].run_id
    for run in full["runs"].values():
        assert f"run {run.run_id}" in text
    assert "000.00 (fixture)" in text  # the GPU run's driver from its environment
    assert "CUDA out of memory (fixture)" in text and "unavailable: eager has no int8" in text
    assert "Your peaks beside the paper" in text and "NVIDIA L4" in text


def test_flags_are_visible(full):
    text = full["text"]
    assert '<span class="flag">wrong-output(relL2=0.31)</span>' in text
    # a missed CI target is a note (its wider interval is shown), not a warning (issue 35)
    assert '<span class="warn">ci-not-met</span>' not in text and "note, not a warning: 1× ci-not-met" in text
    assert "1 (throttle:thermal)" in text  # the contaminated sweep pass left out, and said so
    assert (
        re.search(r'<tr class="flagged"[ >]', text) and "flagged (see tables)" not in text
    )  # legend text lives in PNGs
    assert re.search(r'<span class="flag">\d+ flagged</span>', text)


def test_store_with_no_result(tmp_path):
    from deepgap.store import Store

    empty = str(tmp_path / "empty.sqlite")
    Store(empty).close()
    write_report(empty, str(tmp_path / "e.html"))
    assert "No successful measurement" in (tmp_path / "e.html").read_text()


@pytest.fixture(scope="module")
def cpu_only(full, tmp_path_factory):
    """The CPU run's report (``--run``, through the CLI), written over a copy of the module's full report.

    The earlier report is the full one, copied (building it again cost 20-40 s), with a stale file added.
    """
    d = tmp_path_factory.mktemp("cpu_only")
    html = d / "r.html"
    shutil.copy(full["html"], html)
    shutil.copytree(os.path.join(os.path.dirname(full["html"]), "report_files"), d / "r_files")
    (d / "r_files" / "stale.csv").write_text("old")
    cpu_run = full["runs"]["cpu"].run_id
    rc = main(["report", full["store"], "-o", str(html), "--run", cpu_run])
    return {"rc": rc, "dir": d, "text": html.read_text(encoding="utf-8")}


def test_cpu_only_report_without_telemetry(cpu_only):
    """The report of CPU runs alone (the fixture's CPU run: no telemetry, no other device) says what it lacks.

    The page is `cpu_only`'s ``--run`` selection: the same rows as a store holding only that run (it was a
    second store, built and reported for this test alone).
    """
    text = cpu_only["text"]
    assert "unavailable: no telemetry in these runs" in text
    assert "unavailable: no energy telemetry in these runs" in text
    assert "unavailable: needs a CPU run and another device" in text
    imgs = len(re.findall(r'<img alt="[^"]*" src="data:image/png;base64,', text))
    shown = imgs + text.count('<div class="plot" id=')
    assert shown == 8  # 6 + the two rooflines
    assert sorted(os.listdir(cpu_only["dir"] / "r_files")).count("fig_cpu_thread_scaling.png") == 1


def test_rewrite_replaces_atomically_and_run_selection(cpu_only):
    """Writing over an earlier report replaces its files folder whole; ``--run`` keeps that run only."""
    assert cpu_only["rc"] == 0
    assert not (cpu_only["dir"] / "r_files" / "stale.csv").exists()
    assert not [p for p in os.listdir(cpu_only["dir"]) if p.startswith(".deepgap-report-")]
    text = cpu_only["text"]
    assert "Fixture CPU" in text and "Fixture GPU A" not in text


def test_bad_input_writes_nothing(tmp_path, full, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "afile").write_text("x")
    cases = [
        (["report", str(tmp_path / "missing.sqlite"), "-o", str(out / "a.html")], "does not exist"),
        (["report", full["store"], "-o", str(out / "afile" / "r.html")], "is a file, not a folder"),
        (["report", full["store"], "-o", str(out)], "is a directory"),
        (["report", full["store"], "-o", str(out / "b.html"), "--run", "20990101-000000-ffffff"], "no run"),
        (["report", full["store"], "-o", str(out / "c.html"), "--size", "big"], "WIDTHxHEIGHT"),
    ]
    for argv, match in cases:
        assert main(argv) == 2, argv
        assert match in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["afile"]


def test_unwritable_folder(tmp_path, full, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if (
        os.geteuid() == 0
    ):  # root ignores permission bits (CI runs as root): the check sees them as a user would
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(ro) else real(p, mode))
    try:
        assert main(["report", full["store"], "-o", str(ro / "r.html")]) == 2
        assert "not a writable folder" in capsys.readouterr().err and os.listdir(ro) == []
    finally:
        ro.chmod(0o700)


def test_folder_whose_probe_file_cannot_be_created(tmp_path, full, capsys, monkeypatch):
    """Permission bits say nothing of read-only mounts or a full disk: a probe file is created first."""
    import tempfile

    def refuse(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert main(["report", full["store"], "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "Read-only file system" in err and not (tmp_path / "r.html").exists()


@pytest.mark.slow
def test_run_report_flag(tmp_path, monkeypatch):
    """`deepgap run --report` renders the run it just measured (real tinycnn measurement).

    The handlers run in this process (`InProcessWorker`): the point is the report of a fresh run, not the
    worker's isolation, and a worker process first imports torch and torchvision (10-20 s on two cores).
    """
    import deepgap.drive.sweep
    from deepgap.drive.inprocess import InProcessWorker
    from deepgap.drive.runner import SweepRunner

    def in_process(spec, device):
        runner = SweepRunner(spec, device)
        runner.worker = InProcessWorker(device)
        return runner

    monkeypatch.setattr(deepgap.drive.sweep, "SweepRunner", in_process)
    store, html = str(tmp_path / "s.sqlite"), str(tmp_path / "run.html")
    assert (
        main(
            [
                "run",
                "--models",
                "tinycnn",
                "--batch-sizes",
                "1,2",
                "--iterations",
                "3",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "--target-ci",  # the CPU preset's adaptive repeats (up to its time limit) are not the point here
                "off",
                "--device",
                "cpu",
                "--threads",
                "1",
                "--store",
                store,
                "--quiet",
                "--report",
                html,
            ]
        )
        == 0
    )
    text = Path(html).read_text(encoding="utf-8")
    # the best configuration is named (which batch wins is up to the machine's timing)
    assert re.search(r"tinycnn eager fp32 bs[12] 1 thread 32px", text)
    assert 'id="plot-fig06_throughput_vs_batch"' in text  # interactive: no PNG of it (issue 49)
    assert not os.path.exists(tmp_path / "run_files" / "fig06_throughput_vs_batch.png")


def test_roofline_is_interactive(full):
    """The inference roofline is a plotly figure: every point hoverable, the ceilings drawn (issue 49).

    It was a PNG whose 6-point labels named a dozen of its points.
    """
    import json

    found = re.search(
        r'class="plot-spec" data-target="plot-fig_roofline_inference">(.*?)</script>', full["text"], re.S
    )
    assert found, "the roofline has no interactive version"
    spec = json.loads(found.group(1).replace("<\\/", "</"))
    points = [t for t in spec["data"] if t.get("mode") == "markers"]
    assert points and all("TFLOP/s" in c[1] and "FLOP/byte" in c[1] for t in points for c in t["customdata"])
    assert spec["layout"]["xaxis"]["type"] == "log" and spec["layout"]["yaxis"]["type"] == "log"
