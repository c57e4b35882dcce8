"""Whether a prepared quant graph gives the same logits at every replay, and the fault a configuration fails with.

Why: the quant engine's kernels are exact by construction (no atomics whose order varies; split-K sums its slices in
a fixed order), so one input gives one set of bits, which is what the PDL and branch choices compare their graphs
by. In session 55 (one H100, `benchmarks/pdl_bits.py`) ResNet-50 fp8's plain graph at batch 256 and 1024 changed
85-88% of its logits from one replay to the next (by up to 2.4), and two eager runs first parted at layer2.1's 3×3
convolution (0.8% of its outputs, by up to 124 in fp8 codes); session 56 found its TMA tile at 3 and 4 pipeline
stages racing (`conv_tma.MAX_STAGES`). The PDL choice had read that as "the PDL graph's logits differ". A graph
that does not repeat itself computes something other than the network, whatever its accuracy against fp32 says, so
its configuration stores no number: `fault` is what the engine's ``faults`` reports (`engines.base.Prepared`),
and the row is an error that says why.
"""

from __future__ import annotations

from typing import Any

import torch

REPLAYS = 3  # replays after the first, each compared with it bit for bit


def changed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where ``b`` is not ``a`` value for value (NaN where both hold NaN counts as the same), as a bool mask."""
    a, b = a.float(), b.float()
    return (a != b) & ~(a.isnan() & b.isnan())


def check(runner: Any, x: torch.Tensor, replays: int = REPLAYS) -> dict[str, Any]:
    """``runner(x)`` once, then ``replays`` more times, each output compared with the first bit for bit.

    Returns ``same`` (every replay equal), ``replays``, ``changed`` (the most logits any replay changed), ``of``
    (the logits) and ``max_abs`` (the largest change seen).
    """
    with torch.inference_mode():
        first = runner(x).clone()
        most, worst = 0, 0.0
        for _ in range(replays):
            out = runner(x)
            bad = changed(first, out)
            n = int(bad.sum())
            if n:
                most = max(most, n)
                worst = max(worst, float((out.float() - first.float()).abs()[bad].max()))
    return {"same": most == 0, "replays": replays, "changed": most, "of": first.numel(), "max_abs": worst}


def fault(info: dict[str, Any]) -> str | None:
    """The message a configuration fails with when its graph's logits did not repeat (`check`), else None.

    ``info`` is the prepared network's (`prepare.QuantResult.info`): ``repeatable`` holds each graph checked.
    """
    for which, rep in (info.get("repeatable") or {}).items():
        if not rep["same"]:
            return (
                f"the {which} CUDA graph's logits changed between replays of one input ({rep['changed']} of "
                f"{rep['of']}, by up to {rep['max_abs']:.3g}): a kernel races, so no number from this graph "
                f"is stored (benchmarks/pdl_bits.py finds the first tensor that differs)"
            )
    return None


def at_batch(run: Any) -> str | None:
    """None when two calls of ``run()`` (a candidate kernel at the tuned batch) give the same bits, else why not.

    Why: the tuner checks each candidate against the exact reference on `tuning.CHECK_BATCH` images only, where
    a race in a large grid may not show (sessions 55-56: layer2's 3-stage TMA tile passed that check, then changed
    0.1-1.9% of its outputs at every launch at batch 256 and 1024). A kernel that does not repeat itself at the
    batch it is kept for is refused there, so the network keeps a tile that does. ``run()`` returns one tensor,
    or a tuple of them (a pair).
    """
    first = [t.clone() for t in _tensors(run())]
    again = _tensors(run())
    n = sum(int(changed(a, b).sum()) for a, b in zip(first, again, strict=True))
    if n:
        of = sum(t.numel() for t in first)
        return f"not repeatable: {n} of {of} outputs changed between two runs on one input at the full batch"
    return None


def _tensors(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple | list) else [out]


def at_batch_on_gpu(run: Any, device: Any) -> str | None:
    """`at_batch` on a GPU; None elsewhere (Triton's interpreter runs one thread, where no launch races)."""
    return at_batch(run) if str(device).startswith("cuda") else None
