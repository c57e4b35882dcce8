"""An admission's shape: its token buckets and how an admission splits into packed prefills; padded lengths.

Shared by the worker (`deepgap.serving.worker.llm_prefill`'s `PackedPrefill`, which runs it) and the
simulator (`deepgap.serving.sim.llm_service.LlmService`, which charges it), so both split an admission the
same way. Plain Python: the simulator imports no torch.

A packed prefill runs ``T`` token rows: the newcomers' prompts concatenated, ``T`` their total rounded up
to a bucket (`token_buckets`: four to an octave from 64 rows).
An admission of more than the largest bucket's tokens, or of more prompts than one prefill gathers logits
for, runs as several packed prefills, in arrival order.
"""

from __future__ import annotations

from deepgap.core import switches

# DEEPGAP_SERVE_PREFILL: how a served decoder runs its admissions (packed, padded)
PREFILL_MODES = switches.choices("DEEPGAP_SERVE_PREFILL")


def prefill_mode() -> str:
    """The admissions' prefill the environment asks for (``DEEPGAP_SERVE_PREFILL``; packed when unset).

    Read by the parent before it starts a worker (a bad value is a usage error there, before anything is
    built) and by the worker, which inherits the environment.
    """
    return switches.read("DEEPGAP_SERVE_PREFILL")


# The most token rows one packed prefill takes. Why 4096 and not every slot's longest prompt (64 × 256 =
# 16,384 rows at 8B): the packed attention is one masked T × T product, dense, so its cost grows with T²
# while the Linears' grows with T. At 8B on an H200 (32 layers, 32 heads of 128) the attention is about
# 12% of a 4096-row prefill's FLOPs and 21% of an 8192-row one's; 4096 rows take about 120 ms at the
# measured 30 µs per row, already a tenth of the 2-s TTFT bound. Larger admissions only come once a server
# has fallen far behind, and run as several prefills of at most this many rows.
PACKED_TOKENS = 4096
TOKEN_QUANTUM = 64  # the smallest bucket


def token_buckets(cap: int, low: int = TOKEN_QUANTUM) -> tuple[int, ...]:
    """The totals with a bucket, from ``low`` up to the first at or past ``cap``: four to an octave.

    Steps of a quarter of the octave's start, at least 32 rows: 64, 96, 128, 160, 192, 224, 256, 320, …,
    4096 (23 buckets). Past 64 rows a bucket pads at most a third of its rows, past 128 a fifth. Why not
    powers of two and half-way (13 buckets to 4096): under Poisson arrivals of prompts uniform on 64–256
    tokens those held 83% real rows, these 91% (a simulated mix of 2 to 8 newcomers an admission), and every
    padded row costs what a real one does; a bucket more is one more graph captured and calibrated.
    """
    out = [low]
    while out[-1] < cap:
        out.append(out[-1] + max(32, 1 << (out[-1].bit_length() - 3)))
    return tuple(out)


def smallest_bucket(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest of ``buckets`` (ascending) that holds ``n``: token rows, or newcomers in a padded bucket.

    ``n`` is at most the largest (`groups` keeps packed totals under it; a padded server runs larger
    admissions eagerly).
    """
    return next(b for b in buckets if b >= n)


def padded_length(length: int, quantum: int, cap: int) -> int:
    """``length`` rounded up to a multiple of ``quantum``, but not past ``cap`` (the cache), nor below itself.

    A padded admission's prompt length (`deepgap.serving.worker.llm_prefill.BucketedPrefill`), the prompt
    ring's width, and what the simulator charges a padded admission at (`LlmService.prefill_s`).
    """
    return max(length, min(-(-length // quantum) * quantum, cap))


def groups(lens: list[int], cap: int, prompts: int) -> list[tuple[int, int]]:
    """``lens`` (arrival order) as consecutive ``(start, end)`` runs of at most ``cap`` tokens and ``prompts``.

    A prompt longer than ``cap`` is a run of its own (its caller keeps ``cap`` at least the longest prompt).
    """
    out: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, n in enumerate(lens):
        if i > start and (total + n > cap or i - start >= prompts):
            out.append((start, i))
            start, total = i, 0
        total += n
    if lens:
        out.append((start, len(lens)))
    return out
