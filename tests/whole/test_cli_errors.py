"""Bad input: one line naming the problem and the fix, exit code 2, nothing written."""

import os
import sqlite3

import pytest

from deepgap.cli import main
from deepgap.store import SCHEMA_VERSION, Store

BASE = ["run", "--models", "tinycnn", "--batch-sizes", "1", "--iterations", "1", "--device", "cpu"]
TEXT = [
    "run",
    "--models",
    "tinybert",
    "--seq-lens",
    "64",
    "--batch-sizes",
    "1",
    "--iterations",
    "1",
    "--device",
    "cpu",
]


def _store(tmp_path):
    return str(tmp_path / "out" / "s.sqlite")


def _newer_store(tmp_path):
    p = str(tmp_path / "newer.sqlite")
    Store(p).close()
    con = sqlite3.connect(p)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    con.commit()
    con.close()
    return p


def _text_file(tmp_path):
    p = tmp_path / "notes.sqlite"
    p.write_text("just some notes")
    return str(p)


def _bad_toml(tmp_path):
    p = tmp_path / "sweep.toml"
    p.write_text("models = [resnet50\n")
    return str(p)


def _unknown_key_toml(tmp_path):
    p = tmp_path / "sweep.toml"
    p.write_text('modles = ["resnet50"]\n')
    return str(p)


CASES = [
    # (id, argv builder, expected words in the message)
    (
        "unknown model",
        lambda t: ["run", "--models", "resnet5O", "--device", "cpu", "--store", _store(t)],
        "unknown model",
    ),
    ("unknown engine", lambda t: BASE + ["--engines", "warp", "--store", _store(t)], "unknown engine"),
    (
        "unknown precision",
        lambda t: BASE + ["--precisions", "fp12", "--store", _store(t)],
        "unknown precision",
    ),
    ("unknown preset", lambda t: ["run", "--preset", "fastest", "--store", _store(t)], "unknown preset"),
    (
        "empty batch list",
        lambda t: BASE[:3] + ["--batch-sizes", ",", "--store", _store(t)],
        "--batch-sizes is empty",
    ),
    (
        "zero batch",
        lambda t: BASE[:3] + ["--batch-sizes", "0,4", "--store", _store(t)],
        "not a positive integer",
    ),
    (
        "negative batch",
        lambda t: BASE[:3] + ["--batch-sizes", "-8", "--store", _store(t)],
        "not a positive integer",
    ),
    ("text batch", lambda t: BASE[:3] + ["--batch-sizes", "one", "--store", _store(t)], "list of integers"),
    ("zero iterations", lambda t: BASE + ["--iterations", "0", "--store", _store(t)], "iterations must be"),
    ("text iterations", lambda t: BASE + ["--iterations", "many", "--store", _store(t)], "not an integer"),
    ("bad target ci", lambda t: BASE + ["--target-ci", "150%", "--store", _store(t)], "target CI"),
    ("bad device", lambda t: BASE + ["--device", "tpu", "--store", _store(t)], "unknown device"),
    # peaks and profile stored a run of "unavailable" rows for an unknown device and exited 0
    ("peaks on a bad device", lambda t: ["peaks", "--device", "tpu", "--store", _store(t)], "unknown device"),
    (
        "profile on a bad device",
        lambda t: ["profile", "--model", "tinycnn", "--device", "tpu", "--store", _store(t)],
        "unknown device",
    ),
    (
        "a store named as another store's journal",
        lambda t: BASE + ["--store", str(t / "s.sqlite-journal")],
        "rollback journal",
    ),
    (
        "missing weights",
        lambda t: BASE + ["--weights", "/nonexistent.pt", "--store", _store(t)],
        "does not exist",
    ),
    ("store is a directory", lambda t: BASE + ["--store", str(t)], "is a directory"),
    ("store not sqlite", lambda t: BASE + ["--store", _text_file(t)], "not a deepgap store"),
    ("store from newer deepgap", lambda t: BASE + ["--store", _newer_store(t)], "newer"),
    ("malformed toml", lambda t: ["run", "--config", _bad_toml(t), "--store", _store(t)], "not valid TOML"),
    (
        "unknown toml key",
        lambda t: ["run", "--config", _unknown_key_toml(t), "--store", _store(t)],
        "unknown sweep setting",
    ),
    (
        "missing toml",
        lambda t: ["run", "--config", str(t / "nope.toml"), "--store", _store(t)],
        "does not exist",
    ),
    ("show missing store", lambda t: ["show", str(t / "none.sqlite")], "does not exist"),
    ("export bad folder", lambda t: ["export", _newer_store(t), "-o", "/x.csv"], "newer"),
    ("resume without store", lambda t: ["run", "--resume", "--store", _store(t)], "does not exist"),
    # the input axis (issue 47): an unknown name, a mode no chosen engine takes, a copy a resident input lacks
    ("unknown input", lambda t: BASE + ["--inputs", "fp8-resident", "--store", _store(t)], "unknown input"),
    (
        "input no engine takes",
        lambda t: BASE + ["--inputs", "default,int8-resident", "--store", _store(t)],
        "no chosen engine takes the int8-resident input",
    ),
    (
        "resident input with transfer",
        lambda t: (
            BASE
            + [
                "--engines",
                "quant",
                "--precisions",
                "int8",
                "--inputs",
                "int8-resident",
                "--include-transfer",
            ]
            + ["--store", _store(t)]
        ),
        "already on the device",
    ),
    # a mixed-length text input (issue 50): its lengths, a text model, lengths within the sequence length
    (
        "packed without lengths",
        lambda t: TEXT + ["--inputs", "packed", "--store", _store(t)],
        "--seq-len-dist",
    ),
    (
        "lengths without packed",
        lambda t: TEXT + ["--seq-len-dist", "uniform:8:64", "--store", _store(t)],
        "none is asked for",
    ),
    (
        "packed on an image model",
        lambda t: BASE + ["--inputs", "packed", "--seq-len-dist", "uniform:8:64", "--store", _store(t)],
        "applies to text models",
    ),
    (
        "lengths past the sequence length",
        lambda t: TEXT + ["--inputs", "packed", "--seq-len-dist", "uniform:8:100", "--store", _store(t)],
        "longer than tinybert's sequence length 64",
    ),
    (
        "malformed lengths",
        lambda t: TEXT + ["--inputs", "padded", "--seq-len-dist", "uniform:8", "--store", _store(t)],
        "malformed",
    ),
    # an empty flag value (session 33): `--resume ''` started a new sweep, `report -o ''` called '' a folder
    ("empty --resume", lambda t: BASE + ["--resume", "", "--store", _store(t)], "--resume is empty"),
    (
        "blank --batch-sizes",
        lambda t: BASE + ["--batch-sizes", " ", "--store", _store(t)],
        "--batch-sizes is empty",
    ),
    (
        "empty report -o",
        lambda t: ["report", _store(t), "-o", ""],
        "-o/--output is empty; give it a value or",
    ),
    (
        "empty merge -o",
        lambda t: ["merge", _store(t), _store(t), "-o", ""],
        "-o/--output is empty; give it a value",
    ),
    (  # session 33: --models was dropped without a word and the stored sweep resumed
        "grid flags beside --resume",
        lambda t: ["run", "--resume", "--models", "tinybert", "--store", _store(t)],
        "--resume continues the stored run with its own settings, but --models was given",
    ),
    (
        "a list of nothing",
        lambda t: BASE + ["--precisions", " , ", "--store", _store(t)],
        "--precisions is empty",
    ),
    (
        "empty --trace-dir",
        lambda t: ["profile", "--device", "cpu", "--trace-dir", ""],
        "--trace-dir is empty",
    ),
]


@pytest.mark.parametrize("argv_fn, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, argv_fn, words):
    argv = argv_fn(tmp_path)
    before = sorted(os.listdir(tmp_path))
    before_bytes = {n: (tmp_path / n).read_bytes() for n in before if (tmp_path / n).is_file()}
    try:
        code = main(argv)
    except (
        SystemExit
    ) as exc:  # argparse's own errors (an unknown choice, an empty value) exit from the parser
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("deepgap: error: ") and words.lower() in err.lower()
    assert ";" in err  # problem; fix
    assert sorted(os.listdir(tmp_path)) == before  # nothing created
    for n, b in before_bytes.items():
        assert (tmp_path / n).read_bytes() == b  # nothing changed


def test_cuda_without_gpu(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(BASE[:-2] + ["--device", "cuda", "--store", _store(tmp_path)]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--no-such-flag"])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
