"""What every serve driver records: the run's spec, the build request, the service model, the rows.

The drivers (one model in `scenarios`, several in `tenants`, LoadGen in `loadgen_run`) each store the
run's sweep spec, send the worker its build request, turn its calibration into the simulator's service
model, and write ``serve_curves`` and ``serve_runs`` rows.
Its own module so that the drivers share it without importing each other.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deepgap.core.records import Status
from deepgap.core.result_details import Correctness, EngineInfo
from deepgap.drive.config import SweepSpec
from deepgap.drive.handle import WorkerLost
from deepgap.drive.prelude import prelude_fields
from deepgap.measure.accuracy.dataset import serve_options
from deepgap.serving.records.details import CapacityDetails, CapacityProbe, CurveDetails, LevelDetails
from deepgap.serving.records.storage import LevelRow, ServeRecord, keep_partial
from deepgap.serving.run.process import ServingWorker, SetupFailed, SetupReply, SetupRequest
from deepgap.serving.run.spec import ServeSpec
from deepgap.serving.run.text_spec import TextLoad, length_curves, text_load, text_service
from deepgap.serving.sim.batcher import BatchPolicy
from deepgap.serving.sim.log import LevelSummary, RequestLog
from deepgap.serving.sim.seqlen import Padding
from deepgap.serving.sim.simulator import ServiceModel
from deepgap.serving.sim.text_service import TextService

Say = Callable[[str], None]


@dataclass
class ServeOutcome:
    """What a serve run returns: its id, overall status and the headline numbers."""

    run_id: str | None
    store_path: str
    status: str = "ok"
    reason: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


def stderr_say(msg: str) -> None:
    """Progress line on stderr."""
    print(msg, file=sys.stderr, flush=True)


def run_spec(spec: ServeSpec, device: str, models: list[str]) -> SweepSpec:
    """The run's stored spec: a sweep spec of the served configuration, serving settings in options."""
    sweep = serve_sweep(spec, device, models)
    return sweep.replace(options={"serve": spec.settings(), **serve_options(spec), **sweep.options})


def serve_sweep(spec: ServeSpec, device: str, models: list[str]) -> SweepSpec:
    """The served configuration as a sweep spec, with the run-level prelude's telemetry settings.

    Why a sweep spec: the idle baseline and thermal warm-up are the ones ``deepgap run`` measures
    (`deepgap.drive.session.RunSession.prelude`), which read their settings from one.
    """
    from deepgap.measure.models import resolve_model

    res = spec.resolution or resolve_model(models[0]).default_resolution
    backend = {} if spec.telemetry_backend == "auto" else {"telemetry_backend": spec.telemetry_backend}
    return SweepSpec(
        models=tuple(models),
        engines=(spec.engine,),
        precisions=(spec.precision,),
        batch_sizes=spec.buckets(device),
        memory_formats=(spec.memory_format,),
        device=device,
        resolution=res,
        seed=spec.seed,
        include_transfer=True,
        weights=spec.weights,
        **prelude_fields(spec),  # the idle baseline's and warm-up's settings
        options=backend,
    )


def setup_request(spec: ServeSpec, model: str, device: str) -> SetupRequest:
    """The worker's build and calibration request for ``model``."""
    from deepgap.measure.models import resolve_model
    from deepgap.serving.run.llm_spec import is_decoder, llm_setup_fields

    cuda = device.startswith("cuda")
    if is_decoder(model):  # a decoder: its prompt lengths to calibrate, its cache's length
        text = llm_setup_fields(spec)
    else:
        load = text_load(spec.seq_len_dist, spec.padding, model)
        text = load.setup_fields() if load is not None else {}  # a text model: its lengths, padding, mask
    return SetupRequest(
        model=model,
        engine=spec.engine,
        precision=spec.precision,
        memory_format=spec.memory_format,
        resolution=text.pop("resolution", None) or spec.resolution or resolve_model(model).default_resolution,
        device=device,
        buckets=spec.buckets(device),
        threads=spec.threads,
        weights=spec.weights,
        seed=spec.seed,
        curve_iterations=spec.curve_iterations or (100 if cuda else 30),
        curve_warmup=10 if cuda else 3,
        engine_min_time_s=1.0 if cuda else 0.0,
        options=serve_options(spec),
        **text,
    )


def service_of(
    reply: SetupReply, label: str, text: TextLoad | None = None, seed: int = 0
) -> ServiceModel | TextService:
    """The simulator's service model from a worker's calibration (padding to the prepared sizes).

    A text model's (``text``) is a `TextService`: a curve per calibrated padded length, the levels'
    lengths drawn with ``seed`` as the worker's are.
    """
    bs = sorted(reply.curve_samples_s)
    parts = reply.curve_parts_s
    depth = int(reply.engine_info.get("serving_depth", 1))
    has_intervals = depth > 1 and all("interval_s" in parts.get(b, {}) for b in bs)
    if text is not None:
        return text_service(reply, text, seed, label, depth, has_intervals)
    intervals = (
        tuple(float(parts[b]["interval_s"]) for b in bs)  # serial (depth 1): the latency is all
        if has_intervals
        else None
    )
    return ServiceModel(
        tuple(bs),
        tuple(float(np.median(reply.curve_samples_s[b])) for b in bs),
        {b: np.asarray(reply.curve_samples_s[b]) for b in bs},
        padding="bucket",
        source=label,
        interval_s=intervals,
        depth=depth,
    )


def config_columns(req: SetupRequest) -> dict[str, Any]:
    """The served configuration's columns of a serving row (curves, runs), in their stored order."""
    fields = ("model", "engine", "precision", "device", "memory_format", "resolution")
    return {f: getattr(req, f) for f in fields}


def curve_rows(reply: SetupReply, req: SetupRequest, tenant: str = "") -> list[dict[str, Any]]:
    """``serve_curves`` rows of one calibration."""
    return [
        {
            "tenant": tenant,
            **config_columns(req),
            "batch_size": b,
            "samples_s": reply.curve_samples_s[b],
            **{
                k: v
                for k, v in reply.curve_parts_s.get(b, {}).items()
                if k in ("h2d_s", "compute_s", "d2h_s")
            },
            "details": CurveDetails(
                includes="issue, h2d (uint8), normalise + compute, d2h, sync",
                **{
                    k: v
                    for k, v in reply.curve_parts_s.get(b, {}).items()
                    if k in ("host_s", "interval_s", "engine_s", "engine_burst_s")
                },
                seq_len=req.resolution if req.seq_lens else None,
                seq_len_curves=length_curves(reply, b),
            ),
        }
        for b in sorted(reply.curve_samples_s)
    ]


# the ``serve_runs`` columns a measured (or simulated) level's summary fills
SUMMARY_COLUMNS = (
    *("n", "n_planned", "duration_s", "achieved_qps", "latency_mean_s", "latency_p50_s", "latency_p90_s"),
    *("latency_p95_s", "latency_p99_s", "latency_max_s", "queue_mean_s", "queue_p99_s", "h2d_mean_s"),
    *("compute_mean_s", "d2h_mean_s", "other_mean_s", "mean_batch", "slo_s", "n_over_slo", "verdict"),
    "stopped",
)


def _text_details(d: LevelDetails, req: SetupRequest, summary, predicted) -> None:
    """A text model's level: its length distribution, padding, useful and padded tokens/s."""
    d.seq_len_dist, d.padding = req.seq_len_dist, Padding(req.padding_edges, req.packed).label()
    if summary is not None and summary.padded_tokens_per_s:
        d.useful_tokens_per_s, d.padded_tokens_per_s = (
            summary.useful_tokens_per_s,
            summary.padded_tokens_per_s,
        )
        d.padding_fraction = 1.0 - (summary.useful_tokens_per_s or 0.0) / summary.padded_tokens_per_s
    if predicted is not None:
        d.predicted_useful_tokens_per_s = predicted.useful_tokens_per_s


def level_row(
    req: SetupRequest,
    scenario: str,
    purpose: str,
    policy: BatchPolicy | None,
    target_qps: float | None,
    arrival: str,
    seed: int,
    summary: LevelSummary | None,
    predicted: LevelSummary | None = None,
    log: RequestLog | None = None,
    tenant: str = "",
    phase: str = "",
    status: str = "ok",
    reason: str = "",
    details: LevelDetails | None = None,
) -> LevelRow:
    """One ``serve_runs`` row (and its requests); ``details`` holds the caller's extra facts (LoadGen's)."""
    v: dict[str, Any] = {
        "tenant": tenant,
        "scenario": scenario,
        "purpose": purpose,
        "phase": phase,
        **config_columns(req),
        "max_batch": policy.max_batch if policy else None,
        "max_delay_s": policy.max_delay_s if policy else None,
        "target_qps": target_qps,
        "arrival": arrival,
        "seed": seed,
        "status": status,
        "reason": reason,
    }
    d = details or LevelDetails()
    d.threads = req.threads or None
    d.kv_cache = getattr(req, "kv_cache", None)  # a decoder's fp8 cache: its configuration's, not a column
    if summary is not None:
        v.update({k: getattr(summary, k) for k in SUMMARY_COLUMNS})
        d.n_dropped, d.host_mean_s = summary.n_dropped, summary.host_mean_s
    if getattr(req, "seq_lens", ()) and not getattr(req, "cache_len", 0):  # a decoder's: its `LlmLevel`
        _text_details(d, req, summary, predicted)
    if predicted is not None:
        v.update(
            predicted_qps=predicted.achieved_qps,
            predicted_mean_s=predicted.latency_mean_s,
            predicted_p90_s=predicted.latency_p90_s,
            predicted_p99_s=predicted.latency_p99_s,
        )
        d.predicted_verdict = predicted.verdict
    return LevelRow(v, log, d)


def setup_reply(
    spec: ServeSpec,
    req: SetupRequest,
    worker: ServingWorker,
    rec: Any,
    out: ServeOutcome,
    say: Say,
    building: str,
) -> SetupReply | None:
    """The worker's build and calibration; None once a failed set-up is recorded as the run's one level.

    A worker that could not start or answer (`ServingWorker.failure`) is a failed set-up too. ``building``
    is the progress line said first.
    """
    try:
        if worker.failure is not None:
            raise worker.failure
        rec.env = worker.env or rec.env
        say(building)
        return worker.setup(req, spec.timeout_s, say)
    except (SetupFailed, WorkerLost) as exc:
        status = exc.status.value if isinstance(exc.status, Status) else str(exc.status)
        reason = exc.reason.splitlines()[0]
        rec.levels.append(
            level_row(
                req, spec.scenario, "setup", None, spec.qps, "", spec.seed, None, status=status, reason=reason
            )
        )
        out.status, out.reason = status, reason
        out.lines.append(f"{status}: {reason}")
        return None


@dataclass(frozen=True)
class ModelServing:
    """What one kind of model brings to its serve run (`one_model_run`): the line said first, and its levels."""

    building: str
    serve: Callable[[SetupReply, ServeRecord, ServeOutcome], None]


def one_model_run(
    spec: ServeSpec,
    device: str,
    store_path: str,
    say: Say,
    worker: ServingWorker,
    req: SetupRequest,
    command: str,
    serving: ModelServing,
) -> tuple[ServeRecord, ServeOutcome]:
    """One model's serve run: its record, the worker's set-up, the levels ``serving`` serves, the set-up's facts.

    A failed set-up (`setup_reply`) is the run's one level and nothing is served; the worker is stopped
    whatever happens. An image or text model's ``serving`` is `scenarios.model_serving`, a decoder's
    `llm_run.llm_serving`.
    """
    rec = ServeRecord(spec=run_spec(spec, device, [spec.model]), command=command, env={"device": device})
    out = ServeOutcome(None, os.path.abspath(store_path))
    try:
        reply = setup_reply(spec, req, worker, rec, out, say, serving.building)
        if reply is not None:
            try:
                serving.serve(reply, rec, out)
            finally:  # the levels served before a stop carry their set-up's facts as a finished run's do
                for lv in rec.levels:
                    d = lv.details
                    d.correctness = Correctness.from_json(reply.correctness)
                    d.engine_info = EngineInfo.from_json(reply.engine_info)
                    d.device_mem_used_bytes_at_setup = reply.env.get("device_mem_used_bytes_at_setup")
    except KeyboardInterrupt as exc:
        keep_partial(exc, rec)
        raise
    finally:
        worker.stop()
    return rec, out


def simulated_rows(
    ranked: list[Any], measured: list[Any], row: Callable[[Any, float | None], dict[str, Any]]
) -> list[dict[str, Any]]:
    """The simulator's search results as ``capacity`` rows (``row(result, predicted)``), each marked.

    A policy also searched for real is ``verified``; any other is labelled as never run. Shared by the
    image or text server's search (`server_scenario`) and a decoder's (`llm_capacity`).
    """
    verified = {m.policy for m in measured}
    rows = []
    for r in ranked:
        x = row(r, r.capacity_qps)
        x["details"].verified = r.policy in verified
        if r.policy not in verified:
            x["note"] = "; ".join(n for n in ("unverified (simulated only)", x["note"]) if n)
        rows.append(x)
    return rows


def capacity_row(
    req: SetupRequest,
    rec: Any,
    r: Any,
    slo_s: float,
    confidence: float,
    predicted: float | None,
    probe_tail_s: Callable[[LevelSummary], float | None],
    **details: Any,
) -> dict[str, Any]:
    """A ``capacity`` row for the search result ``r``: its columns, every probe, the caller's ``details``.

    A probe's ``p99_s`` is ``probe_tail_s`` of its level: the latency p99 of an image or text server, the
    TTFT tail of a decoder's (the bound its search is on). Shared by `server_scenario` and `llm_scenario`.
    """
    probes = [
        CapacityProbe(
            rate_qps=p.rate_qps,
            verdict=p.summary.verdict,
            n=p.summary.n,
            p99_s=probe_tail_s(p.summary),
            n_over_slo=p.summary.n_over_slo,
        )
        for p in r.probes
    ]
    return {
        "tenant": "",
        "source": r.source,
        **config_columns(req),
        "device_name": rec.env.get("device_name", ""),
        "slo_s": slo_s,
        "percentile": 0.99,
        "confidence": confidence,
        "max_batch": r.policy.max_batch,
        "max_delay_s": r.policy.max_delay_s,
        "capacity_qps": r.capacity_qps,
        "upper_qps": r.upper_qps,
        "predicted_qps": predicted,
        "n_probes": len(r.probes),
        "note": r.note,
        "details": CapacityDetails(probes=probes, kv_cache=req.kv_cache, **details),
    }
