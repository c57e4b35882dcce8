"""A mixed-length text batch: its sequences' lengths, drawn once, and the index tensors that pack or mask it.

Why: a fixed-length sweep times full sequences, while real text (and MLPerf's BERT, whose SQuAD inputs are
padding-free) comes in mixed lengths. ``--inputs packed`` times a batch whose sequences are laid end to
end with padding removed; ``--inputs padded`` times the same lengths padded to the batch's longest with the
padded keys masked (`deepgap.core.records.TEXT_INPUTS`). Both come from `make`, seeded, so every engine and
every process of one configuration times the same batch, and a row's tokens are its real tokens.

The batch the engine receives is a plain ``(batch, longest)`` id tensor in either mode, padded with id 0:
the model holds the layout (`deepgap.measure.models.bert_net`'s ``set_text_batch``), so an engine (eager,
torch.compile, CUDA graphs, the quant engine) runs it as any text batch, its shapes fixed per configuration.
The first `reference rows <make>` have lengths that do not depend on the batch size, so the fp32 reference
of those rows (each run alone, unpadded, through the model's plain path) is computed once per model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from deepgap.core.lengths import parse_seq_len_dist
from deepgap.core.records import TEXT_INPUTS, input_kind, input_lengths

REFERENCE_SEED = 0  # the reference rows' lengths: the same draw at every batch size


@dataclass(frozen=True)
class TextBatch:
    """The lengths of one mixed-length batch and how the model runs it (``packed`` or ``padded``)."""

    mode: str  # "packed" | "padded"
    lengths: tuple[int, ...]
    dist: str = ""  # the distribution they were drawn from, as ``--seq-len-dist`` spells it

    @property
    def longest(self) -> int:
        """The padded width of the batch's id tensor."""
        return max(self.lengths)

    @property
    def tokens(self) -> int:
        """Real tokens in the batch."""
        return sum(self.lengths)

    @property
    def tokens_per_sample(self) -> float:
        """Real tokens per sequence: the batch's mean length."""
        return self.tokens / len(self.lengths)

    @property
    def computed_per_sample(self) -> float:
        """Tokens each sequence is computed over: its own (packed) or the batch's longest (padded)."""
        return self.tokens_per_sample if self.mode == "packed" else float(self.longest)

    @cached_property
    def mask(self) -> torch.Tensor:
        """``(batch, longest)`` bool: True where a position holds a token."""
        n = torch.tensor(self.lengths)
        return torch.arange(self.longest)[None, :] < n[:, None]

    @cached_property
    def index(self) -> torch.Tensor:
        """int64 ``(tokens,)``: each real token's place in the flattened ``(batch, longest)`` ids, in order."""
        return self.mask.reshape(-1).nonzero().reshape(-1)

    @cached_property
    def positions(self) -> torch.Tensor:
        """int64 ``(tokens,)``: each real token's position in its sequence."""
        return torch.cat([torch.arange(n) for n in self.lengths])

    @cached_property
    def cu_seqlens(self) -> torch.Tensor:
        """int32 ``(batch + 1,)``: where each sequence starts in the packed tokens, then their total."""
        return torch.tensor(np.concatenate([[0], np.cumsum(self.lengths)]), dtype=torch.int32)

    def ids(self, full: torch.Tensor) -> torch.Tensor:
        """The batch's ids from full-length ids ``full`` (batch, ≥ longest): each row cut to its length, padded 0."""
        x = full[:, : self.longest].clone()
        x[~self.mask] = 0
        return x


def make(mode: str, batch: int, reference_rows: int) -> TextBatch:
    """The batch of a stored input mode ("packed:uniform:64:384"), ``batch`` sequences, seeded.

    The first ``min(batch, reference_rows)`` lengths are one draw (`REFERENCE_SEED`) at every batch size; the
    rest are a draw seeded by the batch size, so a configuration's batch is the same in every process.
    """
    dist_text = input_lengths(mode)
    kind = input_kind(mode)
    if dist_text is None or kind not in TEXT_INPUTS:
        raise ValueError(f"{mode!r} is not a mixed-length text input")
    dist = parse_seq_len_dist(dist_text, 1, 1 << 30)
    k = min(batch, reference_rows)
    head = dist.draw(reference_rows, REFERENCE_SEED)[:k]
    rest = dist.draw(batch - k, batch) if batch > k else np.zeros(0, dtype=np.int64)
    return TextBatch(kind, tuple(int(v) for v in np.concatenate([head, rest])), dist.label())


def reference_lengths(mode: str, reference_rows: int) -> tuple[int, ...]:
    """The reference rows' lengths (the same at every batch size; `make`)."""
    return make(mode, reference_rows, reference_rows).lengths
