"""A text batch's sequence lengths: a stated distribution, drawn seeded.

Why in core: serving draws its requests' lengths from it (`deepgap.serving.sim.seqlen`), and a sweep's mixed-length
text input (``--inputs packed --seq-len-dist …``, `deepgap.core.records.TEXT_INPUTS`) draws its batch from it, so
the sweep's config (drive), the worker (measure) and serving read one spelling and one draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from deepgap.core.errors import UsageError
from deepgap.core.limits import positive_number

DIST_EXAMPLE = "fixed:128, uniform:16:128 or 32,64:3,128 (lengths, each with an optional :weight)"


@dataclass(frozen=True)
class SeqLenDist:
    """Sequence lengths of requests.

    ``fixed`` (one length), ``uniform`` (every length in [lo, hi]) or ``choice`` (listed lengths, weighted).
    """

    kind: str
    lengths: tuple[int, ...]  # fixed: (L,); uniform: (lo, hi); choice: the lengths
    weights: tuple[float, ...] = ()  # choice only: relative weights (normalised in `probabilities`)

    @property
    def min_len(self) -> int:  # noqa: D102
        return min(self.lengths)

    @property
    def max_len(self) -> int:  # noqa: D102
        return max(self.lengths)

    def probabilities(self) -> np.ndarray:
        """Weights of `lengths` (choice), summing to 1."""
        w = np.asarray(self.weights or [1.0] * len(self.lengths), dtype=np.float64)
        return w / w.sum()

    def support(self) -> tuple[np.ndarray, np.ndarray]:
        """Every length a request may have (int64) and its probability."""
        if self.kind == "uniform":
            lo, hi = self.lengths
            return np.arange(lo, hi + 1, dtype=np.int64), np.full(hi - lo + 1, 1.0 / (hi - lo + 1))
        return np.asarray(self.lengths, dtype=np.int64), self.probabilities()

    def mean(self) -> float:
        """Expected length of a request."""
        if self.kind == "uniform":
            return (self.lengths[0] + self.lengths[1]) / 2
        return float(np.dot(self.lengths, self.probabilities()))

    def draw(self, n: int, seed: int) -> np.ndarray:
        """``n`` lengths (int64), seeded: the same ``(n, seed)`` gives the same lengths everywhere."""
        rng = np.random.default_rng([seed, 0x5E9])
        if self.kind == "fixed":
            return np.full(n, self.lengths[0], dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.lengths[0], self.lengths[1] + 1, size=n, dtype=np.int64)
        return rng.choice(np.asarray(self.lengths, dtype=np.int64), size=n, p=self.probabilities())

    def label(self) -> str:
        """The spec as the flag spells it."""
        if self.kind == "fixed":
            return f"fixed:{self.lengths[0]}"
        if self.kind == "uniform":
            return f"uniform:{self.lengths[0]}:{self.lengths[1]}"
        return ",".join(f"{v}:{w:g}" for v, w in zip(self.lengths, self.weights, strict=True))


def _int(text: str, spec: str, flag: str = "--seq-len-dist") -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{flag} {spec!r}: {text!r} is not a length", f"pass {DIST_EXAMPLE}") from None


def parse_seq_len_dist(
    text: str | None, default_len: int, max_len: int, flag: str = "--seq-len-dist"
) -> SeqLenDist:
    """``--seq-len-dist`` (None: fixed at the model's default length), each length in [1, ``max_len``].

    ``flag``: the option the spec came from, named in an error (a decoder's ``--input-len-dist`` …).
    """
    if text is None:
        dist = SeqLenDist("fixed", (default_len,))
    else:
        t = text.strip()
        if t.startswith("fixed:"):
            dist = SeqLenDist("fixed", (_int(t[6:], text, flag),))
        elif t.startswith("uniform:"):
            parts = t[8:].split(":")
            if len(parts) != 2:
                raise UsageError(f"{flag} {text!r} is malformed", "pass uniform:LO:HI, e.g. uniform:16:128")
            lo, hi = (_int(p, text, flag) for p in parts)
            if lo > hi:
                raise UsageError(f"{flag} {text!r}: {lo} > {hi}", "pass uniform:LO:HI with LO ≤ HI")
            dist = SeqLenDist("uniform", (lo, hi))
        else:
            dist = _parse_choice(t, text, flag)
    bad = [v for v in dist.lengths if not 1 <= v <= max_len]
    if bad:
        raise UsageError(
            f"{flag} {text!r}: length {bad[0]} is outside the model's 1..{max_len} positions",
            f"keep every length within 1..{max_len}",
        )
    return dist


def _parse_choice(t: str, text: str, flag: str = "--seq-len-dist") -> SeqLenDist:
    lengths: list[int] = []
    weights: list[float] = []
    for item in t.split(","):
        v, _, w = item.strip().partition(":")
        lengths.append(_int(v, text, flag))
        weights.append(positive_number(w, f"{flag} {text!r}: a weight", f"pass {DIST_EXAMPLE}") if w else 1.0)
    if len(set(lengths)) != len(lengths):
        raise UsageError(f"{flag} {text!r} names a length twice", "name each length once")
    if not math.isfinite(sum(weights)):  # each weight finite, their sum not (1e308 twice): no probabilities
        raise UsageError(
            f"{flag} {text!r}: the weights add up past any number", "pass relative weights, e.g. 32:1,64:3"
        )
    return SeqLenDist("choice", tuple(lengths), tuple(weights))
