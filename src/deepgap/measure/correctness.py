"""Output correctness: every engine/precision's logits against the FP32 eager reference.

A fast engine that computes the wrong answer must never win a table. On the same deterministic
inputs we compare logits by relative L2 error, cosine similarity, top-1 agreement and top-5 overlap.
Bounds per precision (relative L2 error and cosine similarity of the logits) are the precision table's
(`deepgap.core.precision.PRECISIONS`: ``rel_l2_bound``, ``cosine_floor``) — loose enough for rounding, tight
enough that a wrong layer, layout or scale blows far past them. A name the table lacks gets 0.25 and 0.95.
Top-1 agreement is reported but not bounded here: with random weights near-tied logits make it noisy.
The check records whether the weights were seeded random or a trained state dict (``weights``), because
only with trained weights can the agreement speak of accuracy (`deepgap.analysis.accuracy`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from deepgap.core.precision import column

REL_L2_BOUND = column("rel_l2_bound")  # live views of the precision table
COSINE_FLOOR = column("cosine_floor")


@dataclass(frozen=True)
class Agreement:
    """How closely an output matches the reference."""

    rel_l2: float
    cosine: float
    top1_agreement: float
    top5_overlap: float
    n_images: int
    bound_rel_l2: float
    flagged: bool
    weights: str = "random"  # "random" (seeded, the default) | "state-dict" (--weights)
    degenerate: str = ""  # "all-zero logits" | "constant logits": the reference says nothing (`degenerate`)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for the store's extra column (``degenerate`` only where there is something to say)."""
        d = asdict(self)
        if not d["degenerate"]:
            del d["degenerate"]
        return d


def compare(out: torch.Tensor, ref: torch.Tensor, precision: str, weights: str = "random") -> Agreement:
    """Compare logits ``out`` (any dtype/device) with the fp32 reference ``ref`` (rows = images).

    ``weights``: "random" or "state-dict", recorded so the analysis knows what the agreement can mean.
    """
    o = out.detach().float().cpu().reshape(ref.shape[0], -1)
    r = ref.detach().float().cpu().reshape(ref.shape[0], -1)
    finite = bool(torch.isfinite(o).all())
    rel = (
        float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r).clamp_min(1e-30))
        if finite
        else float("inf")
    )
    # By hand in float64: cosine_similarity's eps floor on the norms returns < 1 for identical but tiny
    # logits (random-weight MobileNetV3 gives ~1e-9), which would flag a correct engine.
    od, rd = o.double(), r.double()
    norms = torch.linalg.vector_norm(od, dim=1) * torch.linalg.vector_norm(rd, dim=1)
    cos = float(((od * rd).sum(1) / norms.clamp_min(1e-300)).mean()) if finite else float("nan")
    k = min(5, r.shape[1])
    top1 = float((o.argmax(1) == r.argmax(1)).float().mean())
    to, tr = o.topk(k, 1).indices, r.topk(k, 1).indices
    overlap = float(
        sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(to, tr, strict=True)) / (k * r.shape[0])
    )
    bound = REL_L2_BOUND.get(precision, 0.25)
    dead = degenerate(r)
    # a reference without information has no direction: cosine cannot judge it, relL2 still can (an engine
    # that is not constant where the model is, is wrong); the row says the check is empty (`degenerate`)
    flagged = not finite or rel > bound or (not dead and not cos >= COSINE_FLOOR.get(precision, 0.95))
    return Agreement(rel, cos, top1, overlap, int(r.shape[0]), bound, flagged, weights, dead)


def bounds_of(precision: str, kv_cache: str | None = None) -> str:
    """The precision whose bounds a check applies: the weights', or fp8's where an fp8 KV cache is looser.

    Why: fp8 codes of K and V (``ConfigSpec.kv_cache`` "fp8") round each to 3 mantissa bits, so an fp32 or
    bf16 decoder over them is held to what fp8 can give, not to its own weights' bounds. One rule for the
    decode sweep's check (`deepgap.measure.decode_config`, whose row records the bound it was held to,
    `Agreement.bound_rel_l2`) and a served decoder's (`deepgap.serving.worker.llm_setup`), so an fp8-cache
    server is judged as the sweep's fp8-cache rows are.
    """
    own = REL_L2_BOUND.get(precision, 0.25)
    return "fp8" if kv_cache == "fp8" and REL_L2_BOUND.get("fp8", 0.25) > own else precision


def degenerate(ref: torch.Tensor) -> str:
    """Why the reference logits carry no information ("all-zero logits", "constant logits"), or "".

    Every row constant (to float32 rounding of its own scale): the model's output does not depend on the
    input — a zero-initialised head, say, with random weights — so no comparison can tell a right engine
    from a wrong one, and its top-1 is a tie broken by index. The remedy is trained weights (``--weights``).
    """
    r = ref.detach().float().cpu().reshape(ref.shape[0], -1)
    if not r.numel() or not bool(r.isfinite().all()):
        return ""
    scale = r.abs().amax(1).clamp_min(1e-30)
    if not bool(((r.amax(1) - r.amin(1)) <= 1e-6 * scale).all()):
        return ""
    return "all-zero logits" if not bool(r.any()) else "constant logits"
