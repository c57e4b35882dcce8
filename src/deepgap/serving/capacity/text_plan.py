"""``deepgap plan`` for a text encoder (bert-*): a target and capacities in sequences/s and tokens/s.

Why apart from the image plan: a request to an encoder is a sequence and its work is its tokens, so the plan
speaks in seq/s and tokens/s as every other view of text rows does (`deepgap.render.units`). A stored curve
is at one sequence length (a sweep's ``seq_len``; a serve run's longest calibrated length, every request
that long: an upper bound on a mixed-length load's work), so tokens/s = seq/s × that length, and curves at
two lengths are two different loads: a plan is made at one length (``--seq-len``, needed when the stores
hold several). The target is sequences/s (``--qps``) or tokens/s (``--target-tok-s``, ÷ the length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.limits import positive_number
from deepgap.serving.sim.arrivals import MAX_RATE_QPS, MIN_RATE_QPS, parse_rate_qps

UNIT = "seq/s"  # what one request per second of a text model is called


def is_encoder(model: str) -> bool:
    """Whether ``model`` is a text encoder (BERT): planned in seq/s and tokens/s, not a decoder's tokens."""
    from deepgap.measure.models.bert import CONFIGS

    return model in CONFIGS


@dataclass(frozen=True)
class TextPlan:
    """A text model's plan: the one sequence length planned at, the target, the curves at that length."""

    seq_len: int
    seq_per_s: float
    curves: list[Any]

    @property
    def tokens_per_s(self) -> float:  # noqa: D102
        return self.seq_per_s * self.seq_len

    def title(self, model: str, slo_s: float, objective: str) -> str:
        """The table's title: the target in sequences/s and tokens/s."""
        return (
            f"{model}: {self.seq_per_s:,.0f} sequences/s of {self.seq_len} tokens ({self.tokens_per_s:,.0f} "
            f"tokens/s) at p99 ≤ {slo_s * 1e3:g} ms (objective: {objective})"
        )

    def note(self) -> str:
        """How the tokens are counted (printed under the table)."""
        return (
            f"tokens: every sequence {self.seq_len} tokens long, tokens/s = seq/s × {self.seq_len} (a serve "
            "run's curve is read at its longest calibrated length: an upper bound on a mixed-length load's work)"
        )

    def fields(self, capacity_seq_per_s: float) -> dict[str, Any]:
        """A row's text fields in ``--json``: the length, the target and the capacity in both units."""
        return {
            "seq_len": self.seq_len,
            "target_seq_per_s": self.seq_per_s,
            "target_tokens_per_s": self.tokens_per_s,
            "capacity_seq_per_s": capacity_seq_per_s,
            "capacity_tokens_per_s": capacity_seq_per_s * self.seq_len,
        }


def _lengths(curves: list[Any]) -> list[int]:
    return sorted({int(c.key["resolution"]) for c in curves})


def text_plan(
    curves: list[Any], model: str, qps: str | None, tokens: str | None, seq_len: str | None
) -> TextPlan:
    """The plan's length and target from ``--seq-len``, ``--qps`` (seq/s) or ``--target-tok-s``; bad input: one line."""
    if (qps is None) == (tokens is None):
        raise UsageError(
            f"plan for {model} needs one target: --qps (sequences/s) or --target-tok-s (tokens/s)",
            "pass one of them with --slo-p99",
        )
    have = _lengths(curves)
    if seq_len is None:
        if len(have) > 1:
            raise UsageError(
                f"{model}'s curves are at sequence lengths {', '.join(map(str, have))}; a plan is made at one",
                f"pass --seq-len {have[0]} (or another of them)",
            )
        length = have[0]
    else:
        try:
            length = int(seq_len)
        except ValueError:
            length = 0
        if length not in have:
            raise UsageError(
                f"no curve of {model} at sequence length {seq_len} (the stores hold {', '.join(map(str, have))})",
                f"pass --seq-len {have[0]}",
            )
    if qps is not None:
        rate = parse_rate_qps(qps)
    else:
        tok = positive_number(tokens, "--target-tok-s", "pass e.g. --target-tok-s 1e6", "a positive rate")
        rate = tok / length
        if not MIN_RATE_QPS <= rate <= MAX_RATE_QPS:
            raise UsageError(
                f"--target-tok-s {tokens} is {rate:g} sequences/s of {length} tokens, outside "
                f"{MIN_RATE_QPS:g} to {MAX_RATE_QPS:g}",
                "pass a smaller or larger tokens/s",
            )
    return TextPlan(length, rate, [c for c in curves if int(c.key["resolution"]) == length])
