"""Shared fixtures: tiny sweeps that run in seconds on a 2-core CPU."""

from __future__ import annotations

import pytest

from deepgap.config import SweepSpec

TINY = dict(
    models=("tinycnn",), engines=("eager",), precisions=("fp32",), batch_sizes=(1, 2), device="cpu",
    warmup=1, iterations=3, repeats=2, threads=(1,), max_time_s=5.0, timeout_s=120.0,
)


@pytest.fixture
def tiny_spec() -> SweepSpec:
    """A sweep of two configurations of the tiny CNN on one CPU thread."""
    return SweepSpec(**TINY)


def pytest_collection_modifyitems(config, items):
    """Skip @pytest.mark.gpu tests unless CUDA is usable."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run through the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
