"""The input batch a model reads, seeded and sized: images for image models, token ids for text models.

Why one function: the worker's timed batch and correctness rows, the FLOP count, the roofline's cost
and the ONNX export all need "an input of this model at this size", and a text encoder's is not an image
(int64 ids of shape ``(batch, seq_len)`` in ``[0, vocab)``). ``size`` is the model's input size: the image
resolution, or a text model's sequence length (`deepgap.core.records.ConfigSpec` stores it in ``resolution``
too, so every cache and grouping keyed by input size separates sequence lengths).
"""

from __future__ import annotations

from deepgap.core.errors import UsageError
from deepgap.core.lengths import DIST_EXAMPLE, parse_seq_len_dist
from deepgap.core.records import TEXT_INPUTS
from deepgap.measure.models.registry import MODELS, resolve_model


def elements_per_sample(model: str, size: int) -> int:
    """Input elements of one sample: 3·s² pixels, or s token ids."""
    return size if is_text(model) else 3 * size * size


def is_text(model: str) -> bool:
    """Whether ``model`` is a registered text model (token-id inputs, a sequence-length axis).

    A name nobody registered (a module counted by hand) is an image model, as every model was before.
    """
    return model in MODELS and MODELS.get(model).is_text


def check_seq_lens(models: tuple[str, ...], seq_lens: tuple[int, ...], explicit: bool = False) -> None:
    """Sequence lengths within each text model's positions; ``explicit`` (``--seq-lens``): a text model too.

    Why not always the second: a preset's lengths (``--preset transformers``) apply to its text models
    and are simply not used by a sweep of image models only (``--preset transformers --models vit_b_16``).
    """
    if not seq_lens:
        return
    text = [m for m in models if resolve_model(m).is_text]
    if explicit and not text:
        raise UsageError(
            "--seq-lens applies to text models, and none of the models is one",
            "add a text model (e.g. --models bert-base) or drop --seq-lens",
        )
    for m in text:
        longest = resolve_model(m).max_seq_len
        too_long = [s for s in seq_lens if s > longest]
        if too_long:
            raise UsageError(
                f"sequence length {too_long[0]} is longer than {m}'s {longest} positions",
                f"pass --seq-lens of at most {longest}",
            )


def check_text_inputs(
    models: tuple[str, ...],
    seq_lens: tuple[int, ...],
    inputs: tuple[str, ...],
    dist: str | None,
    workload: str = "forward",
) -> None:
    """A mixed-length text input (``--inputs packed``/``padded``) and its ``--seq-len-dist``, each needing the other.

    Its lengths must fit every sequence length a text model is swept at (``seq_len`` is the batch's cap:
    its positions and the padded mode's longest), and it applies to a text model's forward pass only.
    """
    text_inputs = [i for i in inputs if i in TEXT_INPUTS]
    if dist is not None and not text_inputs:
        raise UsageError(
            "--seq-len-dist gives the lengths of a mixed-length text input, and none is asked for",
            "add --inputs packed (or padded), or drop --seq-len-dist",
        )
    if not text_inputs:
        return
    if dist is None:
        raise UsageError(
            f"--inputs {text_inputs[0]} draws its sequence lengths from --seq-len-dist, and none is given",
            f"pass --seq-len-dist, e.g. uniform:64:384 ({DIST_EXAMPLE})",
        )
    if workload != "forward":
        raise UsageError(
            f"--inputs {text_inputs[0]} is a text encoder's forward-pass input, not a {workload} workload's",
            "drop --inputs packed/padded, or measure the encoder without --workload",
        )
    text = [m for m in models if is_text(m)]
    if not text:
        raise UsageError(
            f"--inputs {text_inputs[0]} applies to text models, and none of the models is one",
            "add a text model (e.g. --models bert-large) or drop --inputs packed/padded",
        )
    for m in text:
        entry = resolve_model(m)
        lengths = parse_seq_len_dist(dist, entry.default_resolution, entry.max_seq_len)
        cap = min(seq_lens or (entry.default_resolution,))
        if lengths.max_len > cap:
            raise UsageError(
                f"--seq-len-dist {dist!r} draws sequences of up to {lengths.max_len} tokens, "
                f"longer than {m}'s sequence length {cap}",
                f"pass --seq-lens of at least {lengths.max_len}, or lengths of at most {cap}",
            )
