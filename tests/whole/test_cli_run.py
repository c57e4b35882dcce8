"""The CLI end to end on the tiny model: run, show, export round-trip, list, env, TOML config."""

import json

import pandas as pd
import pytest

from deepgap.cli import main


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One CLI run of 8 configurations, measured in this process (`conftest.inprocess_worker`).

    Why in process: these tests check what the CLI parses, stores, shows and exports, not the worker's
    isolation (tests/drive/test_runner.py, test_resume.py and test_signals.py run real workers); a real worker
    first started a fork server that imported torch and torchvision (~30 s of wall time on two cores).
    """
    from conftest import inprocess_worker

    path = str(tmp_path_factory.mktemp("cli") / "s.sqlite")
    argv = [
        "run",
        "--models",
        "tinycnn",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--batch-sizes",
        "1,4",
        "--precisions",
        "fp32,bf16",
        "--memory-formats",
        "nchw,channels_last",
        "--warmup",
        "1",
        "--iterations",
        "3",
        "--repeats",
        "2",
        "--target-ci",
        "50%",
        "--store",
        path,
        "--json",
    ]
    with pytest.MonkeyPatch.context() as mp, inprocess_worker(mp):
        assert main(argv) == 0
    return path


def test_json_lines(store, capsys):
    main(["show", store, "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 8 and {r["status"] for r in rows} == {"ok"}
    assert {r["memory_format"] for r in rows} == {"nchw", "channels_last"}


def test_show_table(store, capsys):
    assert main(["show", store]) == 0
    out = capsys.readouterr().out
    assert "tinycnn" in out and "channels_last" in out and "8 results" in out
    assert main(["show", store, "--runs"]) == 0
    assert "finished" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "read"), [("r.parquet", pd.read_parquet), ("r.pq", pd.read_parquet),
                                            ("r.JSON", pd.read_json), ("r.txt", pd.read_csv)])  # fmt: skip
def test_export_writes_the_format_its_suffix_names(store, tmp_path, name, read):
    """Before, ``-o r.parquet`` wrote CSV text under a parquet name; an unknown suffix stays CSV."""
    assert main(["export", store, "-o", str(tmp_path / name)]) == 0
    assert len(read(tmp_path / name)) == 8


def test_export_refuses_a_format_its_suffix_contradicts(store, tmp_path, capsys):
    assert main(["export", store, "--format", "csv", "-o", str(tmp_path / "r.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert "names a parquet file" in err and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("fmt", ["csv", "parquet", "json"])
def test_export_round_trip(store, tmp_path, fmt):
    from deepgap.commands.export import export_frame

    out = str(tmp_path / f"r.{fmt}")
    assert main(["export", store, "--format", fmt, "-o", out]) == 0
    back = {"csv": pd.read_csv, "parquet": pd.read_parquet, "json": pd.read_json}[fmt](out)
    ref = export_frame(store)
    assert len(back) == len(ref) == 8
    for col in ("config_key", "status", "batch_size", "latency_median_s", "throughput_ips", "extra"):
        a, b = back[col].tolist(), ref[col].tolist()
        if col in ("latency_median_s", "throughput_ips"):
            assert a == pytest.approx(b, rel=1e-12)
        else:
            assert a == b


def test_export_samples(store, tmp_path):
    out = str(tmp_path / "samples.csv")
    assert main(["export", store, "--samples", "-o", out]) == 0
    df = pd.read_csv(out)
    assert len(df) >= 8 * 6 and set(df.columns) == {
        "result_id",
        "config_key",
        "repeat",
        "iteration",
        "latency_s",
    }
    assert (df["latency_s"] > 0).all()


def test_list_and_env(capsys, monkeypatch):
    import deepgap.api
    from deepgap.drive.inprocess import InProcessWorker
    from deepgap.drive.runner import SweepRunner

    def in_process(spec, device):  # env's probe in this process too: its table is the point, not the worker
        return SweepRunner(spec, device, worker=InProcessWorker(device))

    monkeypatch.setattr(deepgap.api, "SweepRunner", in_process)
    for what in ("models", "engines", "presets", "precisions"):
        assert main(["list", what]) == 0
    out = capsys.readouterr().out
    assert "resnet50" in out and "eager" in out and "paper" in out and "bf16" in out
    assert main(["env", "--device", "cpu", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["environment"]["torch"] and env["can_run"]["eager"]["fp32"] == "yes"
    assert env["can_run"]["eager"]["tf32"].startswith("no: ")
    import torch

    build = "cpu" if torch.version.cuda is None else f"cuda {torch.version.cuda}"
    assert env["environment"]["torch_build"] == build


def test_torch_build_names_cpu_cuda_and_rocm_builds():
    from types import SimpleNamespace as Ns

    from deepgap.core.envinfo import torch_build

    assert torch_build(Ns(version=Ns(cuda=None, hip=None))) == "cpu"
    assert torch_build(Ns(version=Ns(cuda="13.0", hip=None))) == "cuda 13.0"
    assert torch_build(Ns(version=Ns(cuda=None, hip="6.2.4"))) == "rocm 6.2.4"


def test_toml_config_with_preset_and_flag_override(tmp_path):
    import argparse

    from deepgap.commands.run import add_arguments, build_spec

    cfg = tmp_path / "sweep.toml"
    cfg.write_text('preset = "quick"\nmodels = ["tinycnn"]\nbatch_sizes = [2, 3]\n')
    p = argparse.ArgumentParser()
    add_arguments(p)
    spec = build_spec(p.parse_args(["--config", str(cfg), "--repeats", "4"]))
    assert spec.models == ("tinycnn",) and spec.batch_sizes == (2, 3) and spec.repeats == 4
    assert spec.target_ci == 0.05  # from the quick preset


def test_paper_preset_is_the_papers_protocol():
    from deepgap.drive.config import PAPER_BATCHES
    from deepgap.drive.presets import preset

    p = preset("paper")
    assert p.models == ("resnet18", "resnet50", "resnet101") and p.precisions == ("fp32", "fp16")
    assert p.batch_sizes == PAPER_BATCHES == (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512)
    assert (p.warmup, p.iterations, p.repeats, p.target_ci) == (20, 100, 3, None)


@pytest.mark.parametrize("json_out", [False, True])
def test_a_run_ends_on_its_answer_and_json_stays_json(tmp_path, capsys, json_out):
    """The console run ends on what ``deepgap recommend --run ID`` prints; ``--json`` prints JSON lines only."""
    from conftest import inprocess_worker

    path = str(tmp_path / "s.sqlite")
    argv = ["run", "--models", "tinycnn", "--device", "cpu", "--threads", "1", "--batch-sizes", "1,4",
            "--warmup", "1", "--iterations", "3", "--repeats", "2", "--store", path]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp, inprocess_worker(mp):
        assert main([*argv, *(["--json"] if json_out else [])]) == 0
    out = capsys.readouterr().out
    if json_out:
        assert len([json.loads(line) for line in out.splitlines()]) == 2  # every line is JSON
        return
    head, answer = out.split("\nthe answer (deepgap recommend ", 1)
    assert "2 configurations stored" in head and answer.startswith(f"{path} --run ")
    assert "tinycnn (" in answer and "evidence: " in answer and "2 candidate(s) checked" in answer


def test_a_quiet_run_prints_nothing(tmp_path, capsys):
    from conftest import inprocess_worker

    argv = ["run", "--models", "tinycnn", "--device", "cpu", "--threads", "1", "--batch-sizes", "1", "--warmup",
            "1", "--iterations", "3", "--repeats", "2", "--store", str(tmp_path / "s.sqlite"), "--quiet"]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp, inprocess_worker(mp):
        assert main(argv) == 0
    assert capsys.readouterr().out == ""


def test_a_run_that_measured_nothing_exits_1_and_keeps_its_rows(tmp_path, capsys):
    """Every configuration skipped (quant needs a GPU): stored with its reason, and exit 1, not 0."""
    from deepgap.store import Store

    store = str(tmp_path / "s.sqlite")
    argv = ["run", "--models", "tinycnn", "--engines", "quant", "--precisions", "fp8", "--batch-sizes", "1"]
    assert main([*argv, "--device", "cpu", "--quiet", "--store", store]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("deepgap: no configuration was measured (") and "skipped" in err, err
    s = Store(store, readonly=True)
    try:
        assert set(s.results_frame()["status"]) == {"skipped"}
    finally:
        s.close()
