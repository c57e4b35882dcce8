"""A text model's requests: their sequence lengths (a stated distribution) and how a batch is padded.

Why here, below the drivers and the worker: the real server and the simulator must draw the *same*
lengths for the same arrivals (`SeqLenDist.draw` is seeded) and pad a batch the same way
(`Padding.pad_to`), so that a measured level and its prediction differ only in what the simulator
leaves out. Two paddings, as text servers do: ``longest`` (a batch is formed as for images and padded
to its longest sequence) and ``buckets:32,64,128`` (a request joins the queue of the smallest bucket
that holds it, a batch is formed per queue and padded to its bucket). With buckets the requests are
served in *queue order* (`queue_order`): each queue's requests are contiguous, so the batcher's
contiguous-range bookkeeping (`deepgap.serving.sim.batcher`) holds per queue.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from deepgap.core.errors import UsageError
from deepgap.core.lengths import DIST_EXAMPLE, SeqLenDist, parse_seq_len_dist  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class Padding:
    """How a batch is padded: to its longest sequence (``edges`` empty), to its length bucket, or not at all.

    ``packed``: the batch's requests end to end, padding removed (MLPerf BERT's Server condition); a batch is
    formed as for ``longest`` (one queue) and its longest is only attention's bound (`effective_len`).
    """

    edges: tuple[int, ...] = ()  # sorted bucket lengths; empty: pad to the batch's longest
    packed: bool = False

    @property
    def mode(self) -> str:  # noqa: D102
        return "packed" if self.packed else "buckets" if self.edges else "longest"

    def label(self) -> str:
        """The spec as the flag spells it."""
        if self.packed:
            return "packed"
        return "buckets:" + ",".join(map(str, self.edges)) if self.edges else "longest"

    def effective_len(self, lengths: np.ndarray, rows: int) -> float:
        """The length whose calibrated batch of ``rows`` does the work of this one (the simulator's lookup).

        Padded: the padded length. Packed: the batch's tokens, its batch-padding rows one token each (as the
        server runs them), over ``rows``: a calibration batch of that length has as many tokens, so as much
        Linear work (attention's, quadratic in each length, a little more).
        """
        if not self.packed:
            return float(self.pad_to(int(lengths.max())))
        return (float(lengths.sum()) + rows - len(lengths)) / rows

    def pad_to(self, longest: int) -> int:
        """The padded length of a batch whose longest sequence is ``longest``."""
        if not self.edges:
            return longest
        return self.edges[bisect.bisect_left(self.edges, longest)]

    def bucket_index(self, lengths: np.ndarray) -> np.ndarray:
        """Each length's bucket (0 for every length without buckets)."""
        if not self.edges:
            return np.zeros(len(lengths), dtype=np.int64)
        return np.searchsorted(np.asarray(self.edges), lengths, side="left")


def parse_padding(text: str, dist: SeqLenDist) -> Padding:
    """``--padding longest`` or ``buckets:E1,E2,…`` (every request length must fit the largest bucket)."""
    t = (text or "longest").strip()
    if t == "longest":
        return Padding()
    if t == "packed":
        return Padding(packed=True)
    if not t.startswith("buckets:"):
        raise UsageError(f"unknown --padding {text!r}", "pass longest, packed or buckets:32,64,128")
    try:
        edges = sorted({int(e) for e in t[8:].split(",") if e.strip()})
    except ValueError:
        raise UsageError(
            f"--padding {text!r}: bucket lengths must be integers", "pass e.g. buckets:32,64,128"
        ) from None
    if not edges or edges[0] < 1:
        raise UsageError(f"--padding {text!r} names no positive bucket", "pass e.g. buckets:32,64,128")
    if edges[-1] < dist.max_len:
        raise UsageError(
            f"--padding {text!r}: requests up to {dist.max_len} tokens fit no bucket",
            f"add a bucket of at least {dist.max_len}",
        )
    return Padding(tuple(edges))


def queue_order(lengths: np.ndarray, padding: Padding) -> tuple[np.ndarray, tuple[int, ...]]:
    """(order, segment starts): requests in queue order and where each queue starts.

    Each bucket's requests by arrival; one queue (the arrival order) without buckets.
    """
    if not padding.edges:
        return np.arange(len(lengths)), (0,)
    b = padding.bucket_index(lengths)
    order = np.argsort(b, kind="stable")
    counts = np.bincount(b, minlength=len(padding.edges))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return order, tuple(int(s) for s, c in zip(starts, counts, strict=True) if c > 0)


def calibration_lengths(dist: SeqLenDist, padding: Padding, points: int = 4) -> tuple[int, ...]:
    """The padded lengths the worker calibrates.

    The buckets that requests use, or (padding to the longest) ``points`` lengths spanning the
    distribution, between which batch times are interpolated.
    """
    if padding.edges:
        used = {
            padding.pad_to(v)
            for v in (dist.lengths if dist.kind != "uniform" else range(dist.min_len, dist.max_len + 1))
        }
        return tuple(sorted(used))
    if dist.kind != "uniform":
        return tuple(sorted(set(dist.lengths)))
    return tuple(sorted({int(round(x)) for x in np.linspace(dist.min_len, dist.max_len, points)}))


def token_counts(
    lengths: np.ndarray, shapes: list[tuple[int, int, int]], packed: bool = False
) -> tuple[int, int]:
    """(useful, padded) tokens of served batches ``(first, count, padded length)`` over ``lengths``.

    ``packed``: nothing is padded, so the two are equal.
    """
    useful = sum(int(lengths[f : f + c].sum()) for f, c, _ in shapes)
    return useful, useful if packed else sum(c * p for _, c, p in shapes)
