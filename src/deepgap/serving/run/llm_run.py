"""``deepgap serve`` for a decoder, end to end: the worker's set-up, the level or the capacity, the rows.

`deepgap.serving.run.serve_run` runs it (for a decoder, instead of `scenarios.model_serving`) through the
one driver (`rows.one_model_run`) and stores what it returns in one transaction. The levels and the
search are `deepgap.serving.run.llm_scenario` and `deepgap.serving.run.llm_capacity`; here is what ties them:
the set-up (a failed one is the run's one level, as for images), the calibrated curves as
``serve_curves`` rows and the simulator's service, and the set-up's facts on every level.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deepgap.core.records import kv_cache_label
from deepgap.serving.records.details import CurveDetails
from deepgap.serving.records.storage import ServeRecord
from deepgap.serving.run.llm_capacity import find_llm_capacity
from deepgap.serving.run.llm_scenario import LlmContext, fixed_level
from deepgap.serving.run.llm_spec import llm_load, slo_bounds
from deepgap.serving.run.process import ServingWorker, SetupReply, SetupRequest
from deepgap.serving.run.rows import ModelServing, Say, ServeOutcome, config_columns
from deepgap.serving.sim.llm_service import LlmService
from deepgap.serving.sim.packing import prefill_mode


def service_from(reply: Any, req: SetupRequest, label: str) -> LlmService:
    """The simulator's curves from a worker's calibration: prefill per prompt length, decode per slots.

    And where the decode curve was timed (``engine_info["decode_calibrated_at"]``) with each slot count's
    step at position 0 (``curve_parts_s[s]["at_zero_s"]``): a step then costs the line between the two at
    its rows' positions (`LlmService.decode_times`); a calibration without them, the curve's step anywhere.
    """
    zero = {s: float(p["at_zero_s"]) for s, p in reply.curve_parts_s.items() if "at_zero_s" in p}
    return LlmService(
        {v: {b: np.asarray(x) for b, x in s.items()} for v, s in reply.curves_by_len.items()},
        {b: np.asarray(x) for b, x in reply.curve_samples_s.items()},
        req.cache_len,
        source=label,
        counts=tuple(reply.engine_info.get("prefill_counts") or ()),
        quantum=int(reply.engine_info.get("prefill_quantum") or 0),
        tokens=tuple(reply.engine_info.get("prefill_tokens") or ()),
        prompts=int(reply.engine_info.get("prefill_prompts") or 0),
        position=int(reply.engine_info.get("decode_calibrated_at") or 0),
        decode_at_zero=zero,
    )


def llm_serving(
    spec: Any, device: str, trace, say: Say, worker: ServingWorker, req: SetupRequest
) -> ModelServing:
    """How ``spec``'s decoder is served in ``worker`` once built, checked and calibrated: a level or the capacity."""

    def serve(reply: SetupReply, rec: ServeRecord, out: ServeOutcome) -> None:
        rec.curves = llm_curve_rows(reply, req)
        ttft, tpot = slo_bounds(spec)
        c = LlmContext(
            spec,
            req,
            worker,
            llm_load(spec),
            service_from(reply, req, f"calibration of {spec.model}"),
            rec,
            out,
            say,
            trace,
            ttft,
            tpot,
            str(reply.engine_info.get("prefill") or ""),
        )
        if req.kv_cache:  # the headline numbers say which cache they are of (`--json`)
            out.summary["kv_cache"] = req.kv_cache
        if reply.correctness.get("flagged"):
            say(
                "serve: WARNING: continuous batching's tokens differ from each request alone in fp32 "
                f"({reply.correctness.get('top1_agreement'):.3f} of {reply.correctness.get('n_images')} agree)"
            )
        if spec.find_capacity:
            find_llm_capacity(c)
        else:
            fixed_level(c)

    prefill = (  # a packed server calibrates buckets of token rows, whatever the prompts' lengths
        "the packed prefill per bucket of token rows"
        if prefill_mode() == "packed"
        else f"the padded prefill at prompt lengths {', '.join(map(str, req.seq_lens))}"
    )
    # an fp8 cache is named wherever the configuration is
    what = ", ".join(x for x in (spec.engine, spec.precision, kv_cache_label(req.kv_cache)) if x)
    building = (
        f"serve: building {spec.model} ({what}) on {device}: {req.seq_len_dist}, "
        f"cache of {req.cache_len} positions, calibrating slots {', '.join(map(str, req.buckets))} and {prefill}"
    )
    return ModelServing(building, serve)


def _prefills(by_b: dict[int, list[float]], s: int, first: bool, slots: Any) -> dict[str, Any]:
    """The prefill at batch ``s`` where calibrated; the smallest slot count's row also holds the other counts'.

    Those are one prompt's and, where admissions are bucketed, each bucket's newcomer count
    (`deepgap.serving.worker.llm_prefill`): the simulator charges them, so the store keeps them. A packed
    server's are batch 1 at each bucket of token rows (``by_b`` of length ``T``).
    """
    out: dict[str, Any] = {"prefill_samples_s": list(map(float, by_b[s]))} if s in by_b else {}
    if first:
        others = {str(b): list(map(float, x)) for b, x in sorted(by_b.items()) if b not in slots}
        if others:
            out["prefill_by_count_samples_s"] = others
    return out


def _step_words(reply: SetupReply, req: SetupRequest, s: int) -> str:
    """What one calibrated decode step over ``s`` slots was: the cache, the slots' position, the step at 0."""
    words = f"one static decode step over {s} slots, a cache of {req.cache_len} positions each"
    at = reply.engine_info.get("decode_calibrated_at")
    zero = reply.curve_parts_s.get(s, {}).get("at_zero_s")
    if at:
        words += f", every slot at position {at}"
    if zero is not None:
        words += f" (at position 0: {zero * 1e3:.3f} ms, median)"
    return words


def llm_curve_rows(reply: SetupReply, req: SetupRequest) -> list[dict[str, Any]]:
    """``serve_curves`` rows: per slot count its decode steps' seconds; the prefill at that batch in details."""
    return [
        {
            "tenant": "",
            **config_columns(req),
            "batch_size": s,
            "samples_s": reply.curve_samples_s[s],
            "compute_s": reply.curve_parts_s.get(s, {}).get("compute_s"),
            "details": CurveDetails(
                includes=_step_words(reply, req, s),
                interval_s=reply.curve_parts_s.get(s, {}).get("interval_s"),
                workload="decode",
                kv_cache=req.kv_cache,
                seq_len_curves={
                    str(v): got
                    for v, by_b in sorted(reply.curves_by_len.items())
                    if (got := _prefills(by_b, s, s == min(reply.curve_samples_s), reply.curve_samples_s))
                },
            ),
        }
        for s in sorted(reply.curve_samples_s)
    ]
