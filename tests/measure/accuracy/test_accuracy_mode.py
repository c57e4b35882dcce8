"""Accuracy mode end to end on a dataset made here: a tiny CNN trained in-test on coloured squares.

The stored top-1/top-5 are checked against values computed independently (torchvision's v1 PIL
transforms; the quantized ONNX file run through onnxruntime directly), calibration on the dataset's
disjoint split (ORT int8 on the CPU), and bad input: exit 2, nothing written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

COLOURS = {
    "a_red": (200, 30, 30),
    "b_green": (30, 190, 40),
    "c_blue": (30, 40, 210),
    "d_yellow": (210, 200, 30),
}
PER_CLASS = 20
MISLABELLED = 2  # per class: images of the next colour filed under this class (label noise: top-1 < 100%)


def _image(rgb, rng):
    from PIL import Image

    a = np.clip(np.array(rgb)[None, None, :] + rng.normal(0, 25, (40, 40, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(a)


def _make_folder(root):
    rng = np.random.default_rng(0)
    names = list(COLOURS)
    for i, c in enumerate(names):
        (root / c).mkdir(parents=True)
        for j in range(PER_CLASS):
            colour = COLOURS[names[(i + 1) % 4]] if j < MISLABELLED else COLOURS[c]
            _image(colour, rng).save(root / c / f"{j:03d}.png")


def _tv_inputs(paths):
    """Independent preprocessing: torchvision v1 transforms on PIL images (resize 37, crop 32, normalise)."""
    import torch
    from PIL import Image
    from torchvision import transforms as T  # noqa: N812

    tf = T.Compose(
        [
            T.Resize(37),
            T.CenterCrop(32),
            T.ToTensor(),
            T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    return torch.stack([tf(Image.open(p).convert("RGB")) for p in paths])


def _train(root, weights):
    import torch

    from deepgap.measure.models.build import build_model

    paths = sorted(root.rglob("*.png"))
    labels = torch.tensor([sorted(COLOURS).index(p.parent.name) for p in paths])
    clean = torch.tensor([int(p.stem) >= MISLABELLED for p in paths])
    x = _tv_inputs(paths)
    torch.manual_seed(0)
    m = build_model("tinycnn", 32)
    m.train()
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    acc = 0.0
    for _ in range(6):  # colours are easy: 5 steps usually suffice
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x[clean]), labels[clean]).backward()
            opt.step()
        m.eval()
        with torch.no_grad():
            acc = float((m(x).argmax(1) == labels).float()[clean].mean())
        if acc >= 0.95:
            break
        m.train()
    assert acc >= 0.9, f"the in-test model learnt only {acc:.0%} of the clean images"
    torch.save(m.state_dict(), weights)
    return m


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    root = tmp_path_factory.mktemp("acc")
    _make_folder(root / "folder")
    model = _train(root / "folder", root / "tiny.pt")
    return root, model


@pytest.fixture(scope="module")
def measured(labelled, tmp_path_factory):
    import os

    import deepgap
    from deepgap.drive.config import SweepSpec

    root, _ = labelled
    os.environ["DEEPGAP_CACHE"] = str(root / "cache")
    spec = SweepSpec(
        models=("tinycnn",),
        engines=("eager", "onnxruntime"),
        precisions=("fp32", "int8"),
        batch_sizes=(3,),
        device="cpu",
        threads=(1,),
        warmup=1,
        iterations=2,
        repeats=1,
        telemetry=False,
        idle_s=0.0,
        weights=str(root / "tiny.pt"),
        dataset=str(root / "folder"),
        options={"calibration_images": 16},
    )
    store = str(root / "s.sqlite")
    from conftest import inprocess_worker

    with pytest.MonkeyPatch.context() as mp, inprocess_worker(mp):  # scoring, not the worker's isolation
        res = deepgap.run(spec, store=store)
    return store, {(r.spec.engine, r.spec.precision): r for r in res.results}


def _eval_items(root):
    from deepgap.measure.accuracy.dataset import load, split

    cal, ev = split(load(str(root / "folder")), 16, None, 0)
    return cal, ev


def test_stored_accuracy_matches_independent_computation(labelled, measured):
    import torch

    root, model = labelled
    _, by = measured
    cal, ev = _eval_items(root)
    assert len(cal) == 16 and len(ev) == 4 * PER_CLASS - 16 and not {p for p, _ in cal} & {p for p, _ in ev}
    x = _tv_inputs([p for p, _ in ev])
    y = torch.tensor([label for _, label in ev])
    with torch.no_grad():
        logits = model(x)
    top1 = float((logits.argmax(1) == y).float().mean())
    top5 = float((logits.topk(5, 1).indices == y[:, None]).any(1).float().mean())
    assert 0.5 < top1 < 1.0  # the mislabelled images keep it below 100%
    acc = by[("eager", "fp32")].details.accuracy.to_json()
    assert acc["n"] == len(ev) and acc["subset"] == "whole evaluation split"
    assert acc["top1"] == pytest.approx(top1) and acc["top5"] == pytest.approx(top5)
    assert acc["top1_fp32"] == pytest.approx(top1) and acc["top1_agreement_fp32"] == 1.0

    # int8: the cached QDQ model run through onnxruntime by hand, on the same images
    import onnxruntime as ort

    r = by[("onnxruntime", "int8")]
    info = r.details.engine_info.to_json()
    cinfo = info["calibration"]
    assert (
        cinfo["source"] == "dataset" and cinfo["images"] == 16 and cinfo["dataset_sha"] == acc["dataset_sha"]
    )
    sess = ort.InferenceSession(info["quant_path"], providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    xs = x.numpy()
    pad = (-len(xs)) % 3
    xp = np.concatenate([xs, np.repeat(xs[-1:], pad, 0)]) if pad else xs
    q = np.concatenate([sess.run(None, {name: xp[i : i + 3]})[0] for i in range(0, len(xp), 3)])[: len(xs)]
    q1 = float((q.argmax(1) == y.numpy()).mean())
    qa = float((q.argmax(1) == logits.argmax(1).numpy()).mean())
    a8 = r.details.accuracy.to_json()
    assert a8["top1"] == pytest.approx(q1, abs=1.5 / len(ev))  # ≤ one near-tie may differ (v1 vs v2 resize)
    assert a8["top1_agreement_fp32"] == pytest.approx(qa, abs=1.5 / len(ev))
    assert a8["top1_relative"] == pytest.approx(a8["top1"] / acc["top1_fp32"])


def test_run_spec_stores_the_dataset_identity_and_show_has_the_column(labelled, measured, capsys):
    from deepgap.cli import main
    from deepgap.measure.accuracy.dataset import load
    from deepgap.store import Store

    root, _ = labelled
    store, _ = measured
    s = Store(store, readonly=True)
    spec = s.runs()[-1]["spec"]
    s.close()
    assert spec["dataset"] == str(root / "folder")
    assert spec["options"]["dataset"]["sha"] == load(str(root / "folder")).sha
    assert spec["options"]["dataset"]["calibration_images"] == 16
    assert main(["show", store]) == 0
    out = capsys.readouterr().out
    assert "top-1 % (vs fp32)" in out and "(100.0%)" in out
    assert main(["recommend", store, "--json"]) in (0, 1)
    ev = json.loads(capsys.readouterr().out)[0]["choice"]
    assert ev is None or ev["top1"] is not None


def test_plan_carries_top1_and_skips_accuracy_loss(measured, capsys):
    from deepgap.cli import main

    store, by = measured
    assert main(["plan", store, "--qps", "10", "--slo-p99", "10s", "--model", "tinycnn", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    engine, precision = row["configuration"].split()[1:3]
    assert row["top1"] == pytest.approx(by[(engine, precision)].details.accuracy.top1)
    int8 = by[("onnxruntime", "int8")].details.accuracy.to_json()
    if int8["top1_relative"] < 0.99:  # flagged accuracy-loss: never planned with
        assert precision != "int8"


def test_serve_scores_the_served_engine(labelled, tmp_path, capsys, monkeypatch):
    """What serve scores is the point, not its worker's isolation (tests/serving/ keeps real
    processes): the serving worker runs in this process, saving a worker start."""
    import torch
    from conftest import inprocess_serving

    from deepgap.cli import main
    from deepgap.measure.accuracy.dataset import load, split
    from deepgap.serving.records.storage import levels_frame
    from deepgap.store import Store

    root, model = labelled
    store = str(tmp_path / "serve.sqlite")
    argv = [
        "serve",
        "--model",
        "tinycnn",
        "--engine",
        "eager",
        "--precision",
        "fp32",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--batch-sizes",
        "3",
        "--curve-iterations",
        "3",
        "--scenario",
        "offline",
        "--min-queries",
        "16",
        "--min-duration",
        "0.1s",
        "--weights",
        str(root / "tiny.pt"),
        "--dataset",
        str(root / "folder"),
        "--store",
        store,
        "--quiet",
    ]
    inprocess_serving(monkeypatch)
    threads = torch.get_num_threads()  # the serve's --threads 1 is set in this process
    try:
        assert main(argv) == 0, capsys.readouterr().err
    finally:
        torch.set_num_threads(threads)
    s = Store(store, readonly=True)
    try:
        spec, lv = s.runs()[-1]["spec"], levels_frame(s)
    finally:
        s.close()
    n_cal = min(64, 2 * PER_CLASS)  # serve calibrates on the default 64 images, at most half the set
    assert spec["options"]["dataset"]["calibration_images"] == n_cal
    _, ev = split(load(str(root / "folder")), n_cal, None, 0)
    with torch.no_grad():
        pred = model(_tv_inputs([p for p, _ in ev])).argmax(1)
    top1 = float((pred == torch.tensor([label for _, label in ev])).float().mean())
    acc = lv["extra"].iloc[0].accuracy
    assert acc.n == len(ev) and acc.top1 == pytest.approx(top1) and acc.top1_agreement_fp32 == 1.0


def test_csv_variant_and_subset(labelled, tmp_path):
    """A CSV of path,label names the same items as the folder (so the worker scores the same split);
    --accuracy-samples caps the evaluation split and says so."""
    import argparse

    from deepgap.commands.run import add_arguments, build_spec
    from deepgap.measure.accuracy.dataset import describe, load

    root, _ = labelled
    rows = ["path,label"] + [
        f"{p.relative_to(root)},{sorted(COLOURS).index(p.parent.name)}"
        for p in sorted((root / "folder").rglob("*.png"))
    ]
    (root / "set.csv").write_text("\n".join(rows) + "\n")
    folder, table = load(str(root / "folder")), load(str(root / "set.csv"))
    assert table.kind == "csv" and table.items == folder.items and len(table.classes) == 4
    named = root / "named.csv"  # class names instead of indices: indexed in sorted order
    named.write_text("\n".join(f"{f},{Path(f).parent.name}" for f, _ in folder.items))
    assert [lab for _, lab in load(str(named)).items] == [lab for _, lab in folder.items]
    p = argparse.ArgumentParser()
    add_arguments(p)
    spec = build_spec(
        p.parse_args(
            [
                "--models",
                "tinycnn",
                "--device",
                "cpu",
                "--dataset",
                str(root / "set.csv"),
                "--accuracy-samples",
                "10",
                "--min-accuracy",
                "95%",
            ]
        )
    )
    assert spec.accuracy_samples == 10 and spec.min_accuracy == pytest.approx(0.95)
    info = describe(spec)
    assert (
        info["eval_images"] == 10
        and info["subset"] == f"10 of the {4 * PER_CLASS - min(64, 2 * PER_CLASS)} evaluation images"
    )
    assert info["sha"] == table.sha != folder.sha  # the identity names the kind too


def _bad_run(tmp_path, weights, dataset):
    from deepgap.cli import main

    store = tmp_path / "bad.sqlite"
    code = main(
        [
            "run",
            "--models",
            "tinycnn",
            "--device",
            "cpu",
            "--batch-sizes",
            "1",
            "--weights",
            str(weights),
            "--dataset",
            str(dataset),
            "--store",
            str(store),
            "--quiet",
        ]
    )
    return code, store


@pytest.mark.parametrize("case", ["missing", "empty-class", "corrupt", "bad-weights", "label-range"])
def test_bad_input_exits_2_and_writes_nothing(labelled, tmp_path, case, capsys):
    import torch

    root, _ = labelled
    weights, data = root / "tiny.pt", tmp_path / "data"
    if case != "missing":
        shutil.copytree(root / "folder", data)
    if case == "empty-class":
        (data / "e_empty").mkdir()
    elif case == "corrupt":
        (data / "a_red" / "000.png").write_bytes((data / "a_red" / "000.png").read_bytes()[:60])
    elif case == "bad-weights":
        weights = tmp_path / "w.pt"
        torch.save({"stem.0.weight": torch.zeros(8, 3, 3, 3)}, weights)
    elif case == "label-range":
        (tmp_path / "l.csv").write_text(f"{data / 'a_red' / '001.png'},12\n")
        data = tmp_path / "l.csv"
    code, store = _bad_run(tmp_path, weights, data)
    err = capsys.readouterr().err
    assert code == 2 and not store.exists(), err
    from deepgap.cli import main

    serve = main(
        [
            "serve",
            "--model",
            "tinycnn",
            "--device",
            "cpu",
            "--scenario",
            "offline",
            "--weights",
            str(weights),
            "--dataset",
            str(data),
            "--store",
            str(store),
            "--quiet",
        ]
    )
    assert serve == 2 and not store.exists() and err.split(";")[0] in capsys.readouterr().err
    assert {
        "missing": "does not exist",
        "empty-class": "holds no images",
        "corrupt": "corrupt",
        "bad-weights": "does not fit",
        "label-range": "has label 12",
    }[case] in err
