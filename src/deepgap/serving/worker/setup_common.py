"""What every serving set-up shares (images, text, decoders): its engine, its phases said, its reply.

Runs in the worker process only, beside `deepgap.serving.worker.server` (the executor and the real server),
which the set-ups' handlers also use: `handlers`, `text_setup` and `llm_setup` each build and calibrate their
kind of model, then answer with `setup_reply`.
"""

from __future__ import annotations

from typing import Any

import torch

from deepgap.core import envinfo
from deepgap.core.progress import Phases
from deepgap.core.records import Status
from deepgap.measure.engines import get_engine
from deepgap.measure.worker import nvml_used_bytes
from deepgap.serving.run.process import SetupFailed, SetupReply


def setup_phases() -> Phases:
    """A serving set-up's phases, each said as it ends under serve's ``set-up`` prefix (`deepgap.core.progress`).

    Why: an 8B decoder's set-up compiled for minutes on a fresh GPU machine with nothing said (session 50); the
    image, text and decoder set-ups say theirs alike, and `setup_reply` keeps their seconds.
    """
    return Phases("serve: set-up: ")


def setup_reply(
    state: Any,
    req: Any,
    executor: Any,
    curve: dict,
    parts: dict,
    check: dict,
    phases: Phases | None = None,
    **fields: Any,
) -> SetupReply:
    """A setup's reply: its service curve, its check against fp32, the device (`handle_setup` times it).

    ``curve``: batch → timed samples (its batches are the reply's buckets); ``parts``: the curve's
    parts; ``check``: the correctness record; ``phases``: the set-up's (`setup_phases`), their seconds kept
    as ``engine_info["setup_phases_s"]``; ``fields``: the rest of `SetupReply`. A CUDA setup's reply also
    carries its peak reserved memory and NVML's used bytes.
    """
    if phases is not None:  # where the set-up's time went, as each phase ended
        fields["engine_info"] = {**fields.get("engine_info", {}), "setup_phases_s": phases.seconds}
    reply = SetupReply(
        caps=state.caps,
        env=envinfo.collect(req.device),
        buckets=tuple(sorted(curve)),
        curve_samples_s=curve,
        curve_parts_s=parts,
        correctness=check,
        **fields,
    )
    if executor.cuda:
        reply.peak_mem_reserved_bytes = int(torch.cuda.max_memory_reserved(req.device))
        used = nvml_used_bytes(req.device)
        if used is not None:
            reply.env = {**reply.env, "device_mem_used_bytes_at_setup": used}
    return reply


def engine_for(state: Any, req: Any) -> tuple[Any, Any]:
    """(engine, first bucket's configuration) of a setup request (image and text setups), threads set.

    An engine that cannot run the configuration here is a SKIPPED setup, not an error.
    """
    spec1 = req.config(req.buckets[0], include_transfer=True)
    engine = get_engine(req.engine, req.options)
    why_not = engine.available() or engine.supports(spec1, state.caps)
    if why_not:
        raise SetupFailed(Status.SKIPPED, why_not)
    torch.set_num_threads(req.threads or state.default_threads)
    return engine, spec1
