"""A decode GEMV's candidate tiles timed on weights that stream from HBM, as the step reads them.

Why: a decode step reads every weight once a token (about 7.5 GB at the 8B shape in fp8), so each GEMV's matrix
comes from HBM, never from the 50 MB L2. The tuner (`gemv.fastest`) times a candidate as 20 calls in one CUDA
graph; on one matrix, qkv's 25 MB and o's 17 MB sit in L2 after the first call, and the candidates are ranked
in a regime the step never runs in. On one H200 (session 45) `deepgap run` and the bare loop, each timing its
own tiles, chose different qkv tiles and ran the same step at 2.3817 and 2.3512 ms. With
``DEEPGAP_GEMV_TUNE=streamed`` the 20 calls cycle through copies of the matrix that together fill at least
twice the L2, so each call reads its weights from HBM. ``cached`` (the default): one matrix, as before. Timed
on one H100 (session 46, results/h100/session46): streamed chose another qkv tile and ran 0.8% slower (334.0 →
331.5 tokens/s in the bare loop), so it stays opt-in; the H200's A/B is still to run.
"""

from __future__ import annotations

import torch

from deepgap.core import switches

L2_FALLBACK = 50 * 2**20  # Hopper's L2, where the device does not report its own
MAX_COPIES = 8


def streaming() -> bool:
    """Whether decode GEMV tiles are timed on weights streamed from HBM (``DEEPGAP_GEMV_TUNE=streamed``)."""
    return switches.read("DEEPGAP_GEMV_TUNE") == "streamed"


def copies_needed(nbytes: int, l2_bytes: int) -> int:
    """How many matrices of ``nbytes`` fill at least twice an L2 of ``l2_bytes`` (1 to `MAX_COPIES`)."""
    return max(1, min(MAX_COPIES, -(-2 * l2_bytes // max(nbytes, 1))))


def streamed_copies(w: torch.Tensor) -> list[torch.Tensor]:
    """``w`` and enough copies of it that calls cycling through them read each from HBM (`copies_needed`)."""
    l2 = L2_FALLBACK
    if w.device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(w.device), "L2_cache_size", 0) or L2_FALLBACK
    return [w] + [w.clone() for _ in range(copies_needed(w.nbytes, l2) - 1)]


def label() -> str:
    """What a decode row's ``decode.tiles`` adds where the tiles were timed streamed (`gemv.chosen`)."""
    return " (timed on weights streamed from HBM: DEEPGAP_GEMV_TUNE=streamed)" if streaming() else ""
