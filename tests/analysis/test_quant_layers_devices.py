"""The quant per-layer roofline figure names the GPU in each panel's title.

Why: the figure draws a panel per configuration (device, model, precision, largest batch) and titled it
"resnet50 int8 batch 256": in a store of two GPUs, two panels bore that one title, each with its own roof.
"""

from __future__ import annotations

from packed_stores import packed, unpack
from repo_paths import FIXTURES

from deepgap.analysis.quant_layers import load
from deepgap.analysis.quant_layers_section import roofline_figure


def test_each_panel_names_its_gpu(tmp_path):
    store = unpack(packed(FIXTURES / "two_gpus_small.sqlite"), tmp_path / "two.sqlite")  # H200 and H100
    frame, _ = load(str(store))
    assert set(frame["device_name"]) == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}
    fig = roofline_figure(frame)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert sorted(titles) == [
        "H100 · resnet18 int8 batch 256",
        "H100 · resnet50 int8 batch 256",
        "H200 · resnet18 int8 batch 256",
        "H200 · resnet50 int8 batch 256",
    ]
    # one GPU: its name still heads every panel
    one = roofline_figure(frame[frame["device_name"] == "NVIDIA H200"])
    assert all(ax.get_title().startswith("H200 · ") for ax in one.axes if ax.get_visible())
