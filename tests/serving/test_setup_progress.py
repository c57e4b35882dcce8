"""A serving worker's set-up says each phase as it ends (`deepgap.core.progress`), for images and text as for
decoders (tests/serving/test_serving_llm.py): the lines on serve's stderr, their seconds kept in engine_info."""

from __future__ import annotations

import pytest
from clirun import SERVE_SMALL, deepgap_cli
from conftest import inprocess_serving


def _setup_lines(stderr: str) -> list[str]:
    return [
        line.removeprefix("serve: set-up: ")
        for line in stderr.splitlines()
        if line.startswith("serve: set-up: ")
    ]


@pytest.mark.parametrize(
    ("args", "phases"),
    [
        (
            [*SERVE_SMALL],
            [
                "eager prepared for 3 batch size(s)",
                "outputs checked against fp32",
                "service curve calibrated",
            ],
        ),
        (
            [a if a != "tinycnn" else "tinybert" for a in SERVE_SMALL] + ["--seq-len-dist", "uniform:8:32"],
            [
                "eager prepared",
                "outputs checked against each request alone in fp32",
                "service curves calibrated",
            ],
        ),
    ],
    ids=["image", "text"],
)
def test_a_serving_setup_says_its_phases_with_their_seconds(tmp_path, monkeypatch, args, phases):
    inprocess_serving(monkeypatch)
    store = str(tmp_path / "s.sqlite")
    p = deepgap_cli("serve", *args, "--qps", "50", "--no-telemetry", "--store", store)
    assert p.returncode == 0, p.stderr
    said = _setup_lines(p.stderr)
    assert len(said) == len(phases)
    assert all(line.startswith(ph) and " in " in line for line, ph in zip(said, phases, strict=True)), said
    from deepgap.serving.records.storage import levels_frame
    from deepgap.store import Store

    s = Store(store, readonly=True)
    try:
        info = levels_frame(s)["extra"].iloc[0].engine_info
    finally:
        s.close()
    kept = info.get("setup_phases_s")  # each phase's seconds, by the name said before " in "
    assert [line.startswith(f"{name} in ") for name, line in zip(kept, said, strict=True)] == [True] * len(
        said
    )
