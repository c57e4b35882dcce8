"""A sweep configuration's mixed-length text input (``--inputs packed``/``padded``): its batch and its record.

Why apart from `deepgap.measure.configuration`: that module times any configuration; this one knows what a
mixed-length batch changes around the timing. The model is set to the batch's layout before the engine
prepares it (`deepgap.measure.models.text_batch`), the reference rows are each run alone at their own length,
the FLOPs are those of the batch's sequences rather than of full ones, and the row records its real tokens
(`deepgap.core.result_details.TextBatch`), which tokens/s and J/token count.
"""

from __future__ import annotations

from typing import Any

import torch

from deepgap.core import result_details
from deepgap.core.records import TEXT_INPUTS, ConfigSpec, input_kind
from deepgap.measure.device import torch_dtype
from deepgap.measure.models import text_batch
from deepgap.measure.models.text_batch import TextBatch


def batch_of(spec: ConfigSpec, reference_rows: int) -> TextBatch | None:
    """The configuration's mixed-length batch, or None for any other input."""
    if input_kind(spec.input_mode) not in TEXT_INPUTS:
        return None
    return text_batch.make(str(spec.input_mode), spec.batch_size, reference_rows)


def reference_lengths(spec: ConfigSpec, reference_rows: int) -> tuple[int, ...]:
    """The reference rows' lengths for `deepgap.measure.worker.WorkerState.reference` (() for full rows)."""
    if input_kind(spec.input_mode) not in TEXT_INPUTS:
        return ()
    return text_batch.reference_lengths(str(spec.input_mode), reference_rows)


def apply(model: Any, batch: TextBatch, x_full: torch.Tensor) -> torch.Tensor:
    """Set ``model`` to the batch's layout; the batch's ids cut from full-length ids ``x_full``."""
    set_batch = getattr(model, "set_text_batch", None)
    if set_batch is None:
        raise ValueError(f"{type(model).__name__} takes no mixed-length text batch")
    set_batch(batch)
    return batch.ids(x_full)


def flops_ratio(model: Any, batch: TextBatch, seq_len: int) -> float | None:
    """FLOPs per sequence of the batch over those of one full-length sequence, by the model's formula.

    The worker's FLOP counter runs once per model at full length; this scales it. Packed: each sequence at
    its own length; padded: every sequence at the batch's longest (the work done, padding included).
    Tokens/s counts real tokens either way. None where the model has no formula.
    """
    formula = getattr(getattr(model, "config", None), "flops", None)
    if formula is None:
        return None
    if batch.mode == "packed":
        per = sum(formula(n) for n in batch.lengths) / len(batch.lengths)
    else:
        per = formula(batch.longest)
    return per / formula(seq_len)


def details(batch: TextBatch, model: Any, spec: ConfigSpec) -> result_details.TextBatch:
    """The row's record of its batch and of the attention it ran.

    ``model``: the model the engine prepared; its packed layout (`deepgap.measure.models.bert_net.Packed`)
    says the attention its last eager call took, else (a compiled model is never called eagerly) the one
    its rule gives for the device and the attention's dtype (the quant engine's: bf16).
    """
    if batch.mode != "packed":
        attention = "SDPA with a key mask over the padded batch"
    else:
        from deepgap.measure.models.bert_net import Packed

        dtype = torch.bfloat16 if spec.engine == "quant" else torch_dtype(spec.precision)
        attention = getattr(getattr(model, "packed", None), "ran", None) or Packed.kind(spec.device, dtype)
    return result_details.TextBatch(
        lengths=batch.dist,
        tokens_per_sample=batch.tokens_per_sample,
        padded_tokens_per_sample=batch.computed_per_sample,
        longest=batch.longest,
        attention=attention,
    )
