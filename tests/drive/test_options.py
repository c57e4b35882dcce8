"""A sweep file's ``[options]``: every key a user may set is checked when the file is read (session 33).

Before, ``[options]`` was taken as written: a misspelled key was ignored, ``telemetry_backend =
"nonsense"`` left every row without power, and a bad TensorRT profile failed only in the build.
"""

from __future__ import annotations

import os

import pytest

from deepgap.cli import main
from deepgap.core.errors import UsageError
from deepgap.drive.options import USER_OPTIONS, check_user_options
from deepgap.drive.presets import load_toml

GOOD = {
    "cache_dir": "/tmp/deepgap-cache",
    "calibration_images": 8,
    "dataset_workers": 0,
    "ort_calibration_method": "entropy",
    "telemetry_backend": "fake:steady",
    "trt_profile": "range",
    "trt_profile_batches": [1, 8, 64],
    "trt_workspace_gib": 1.5,
}


def test_every_user_option_is_accepted_with_a_good_value(tmp_path):
    check_user_options({**GOOD, "calibration_dir": str(tmp_path)}, "f.toml")
    assert set(GOOD) | {"calibration_dir"} == set(USER_OPTIONS)  # a new option gets a case here


@pytest.mark.parametrize(
    "options, words",
    [
        ({"calibraton_images": 8}, "unknown option 'calibraton_images'; use one of: cache_dir"),
        ({"calibration_images": 0}, "calibration_images must be a positive integer"),
        ({"calibration_images": True}, "calibration_images must be a positive integer"),
        ({"dataset_workers": -1}, "dataset_workers must be a whole number"),
        ({"ort_calibration_method": "median"}, "ort_calibration_method 'median' is unknown"),
        (
            {"telemetry_backend": "nonsense"},
            "telemetry_backend 'nonsense' is unknown; choose one of auto, fake:",
        ),
        ({"trt_profile": "dynamic"}, "trt_profile 'dynamic' is unknown"),
        ({"trt_profile_batches": [8, 1, 64]}, "trt_profile_batches must be [min, opt, max]"),
        ({"trt_workspace_gib": 0}, "trt_workspace_gib must be a positive number"),
        ({"cache_dir": ""}, "cache_dir must be a path"),
        ({"calibration_dir": "/no/such/folder"}, "is not a folder"),
    ],
)
def test_a_bad_option_names_the_file_and_the_fix(options, words):
    with pytest.raises(UsageError) as exc:
        check_user_options(options, "config file 'f.toml'")
    assert str(exc.value).startswith("config file 'f.toml': ") and words in str(exc.value)
    assert exc.value.fix


def test_options_that_are_not_a_table_are_refused(tmp_path):
    f = tmp_path / "o.toml"
    f.write_text('options = "fast"\n')
    with pytest.raises(UsageError, match="options must be a table"):
        load_toml(str(f))


def test_run_refuses_a_sweep_file_with_a_bad_option_before_anything_is_written(tmp_path, capsys):
    f = tmp_path / "o.toml"
    f.write_text('models = ["tinycnn"]\nbatch_sizes = [1]\n[options]\ntelemetry_backend = "nonsense"\n')
    store = tmp_path / "s.sqlite"
    assert main(["run", "--config", str(f), "--device", "cpu", "--quiet", "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "telemetry_backend 'nonsense' is unknown" in err
    assert sorted(os.listdir(tmp_path)) == ["o.toml"]


@pytest.mark.parametrize(
    "lines,refused",
    [
        ("telemetry = false\nthermal_warmup = true", "thermal_warmup"),
        ("telemetry = false\nidle_s = 5.0\nsample_hz = 20.0", "idle_s, sample_hz"),
        ("telemetry = false\nthermal_warmup = false\nidle_s = 0.0", None),
        ('preset = "gpu"\ntelemetry = false', None),  # the preset's warm-up goes with the telemetry
        ("telemetry = true\nthermal_warmup = true", None),
    ],
)
def test_no_telemetry_beside_a_setting_that_asks_for_samples_is_refused(tmp_path, lines, refused):
    """As the CLI refuses --no-telemetry beside --thermal-warmup: the warm-up was dropped without a word."""
    f = tmp_path / "sweep.toml"
    f.write_text(f'models = ["tinycnn"]\ndevice = "cpu"\n{lines}\n')
    if refused is None:
        assert load_toml(str(f)).telemetry == ("telemetry = true" in lines)
        return
    with pytest.raises(UsageError, match=f"telemetry = false takes no samples, but {refused} asks") as e:
        load_toml(str(f))
    assert e.value.fix.startswith("drop telemetry = false or")


@pytest.mark.parametrize(
    "flags, lines, cli_refused, file_refused",
    [
        (["--thermal-warmup", "--sample-hz", "20"], "thermal_warmup = true\nsample_hz = 20.0",
         "--thermal-warmup, --sample-hz", "thermal_warmup, sample_hz"),
        (["--idle-time", "5", "--thermal-window", "3"], "idle_s = 5.0\nthermal_window_s = 3.0",
         "--idle-time, --thermal-window", "idle_s, thermal_window_s"),
        (["--idle-time", "0"], "idle_s = 0.0", None, None),
    ],
)  # fmt: skip
def test_the_flags_and_the_config_file_refuse_the_same_settings(
    tmp_path, flags, lines, cli_refused, file_refused
):
    """One rule (`prelude.asks_for_samples`) behind ``--no-telemetry`` and ``telemetry = false``: the same
    settings refused, in the same order, each in its own spelling."""
    import argparse

    from deepgap.commands.session_flags import add_session_arguments, read_session_arguments

    p = argparse.ArgumentParser()
    add_session_arguments(p)
    f = tmp_path / "sweep.toml"
    f.write_text(f'models = ["tinycnn"]\ndevice = "cpu"\ntelemetry = false\n{lines}\n')
    reads = (
        lambda: read_session_arguments(p.parse_args([*flags, "--no-telemetry"])),
        lambda: load_toml(str(f)),
    )
    for read, refused in zip(reads, (cli_refused, file_refused), strict=True):
        if refused is None:
            read()
            continue
        with pytest.raises(UsageError, match=f"takes no samples, but {refused} asks for them"):
            read()
