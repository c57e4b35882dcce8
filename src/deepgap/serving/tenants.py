"""Several models served on one device at once, one process each, each with its own arrival stream.

Every tenant is calibrated alone (its service curve), given a rate (its own ``:QPS``, ``--qps``, or
``--load`` × the capacity the simulator predicts for it alone at the SLO — its saturation
throughput without an SLO), then measured in phases: each tenant alone (the others idle but resident,
holding their memory), each pair, and all together. A tenant's arrivals are identical in every phase
(same seed), so a difference between phases is interference. Processes start a phase at one shared
``perf_counter`` instant (CLOCK_MONOTONIC is host-wide on Linux). Each tenant gets an equal share of
the host's cores for its intra-op threads (unless ``--threads`` is given): with every process at the
default, one per core, their spinning OpenMP threads oversubscribe the host, and the host time per
batch, not the device, becomes the interference being measured (docs/serving.md, "Tenants"). A tenant
that cannot be built because the device is full makes the run's status ``oom``, with the tenants
already resident named.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import replace
from typing import Any

import numpy as np

from deepgap.core.records import Status
from deepgap.drive.handle import WorkerLost
from deepgap.serving import arrivals as arr
from deepgap.serving.batcher import BatchPolicy, StopRule
from deepgap.serving.capacity import LoadSettings, find_capacity, sim_probe
from deepgap.serving.log import summarize
from deepgap.serving.process import LevelRequest, ServingWorker, SetupFailed, SetupRequest
from deepgap.serving.rows import ServeOutcome, curve_rows, level_row, run_spec, service_of, setup_request
from deepgap.serving.spec import DEFAULT_POLICY, ServeSpec
from deepgap.serving.storage import ServeRecord


def tenant_labels(names: list[str]) -> list[str]:
    """Unique labels: a model named twice becomes ``name#1``, ``name#2``."""
    return [f"{n}#{names[:i].count(n) + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def tenant_threads(n_tenants: int, cores: int | None = None) -> int:
    """Intra-op threads per tenant: an equal share of the host's cores, at least one."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // max(1, n_tenants))


def phases(n: int) -> list[tuple[int, ...]]:
    """Alone, every pair, then all together (when more than two)."""
    out = [(i,) for i in range(n)] + list(itertools.combinations(range(n), 2))
    if n > 2:
        out.append(tuple(range(n)))
    return out


def tenant_request(spec: ServeSpec, i: int, device: str) -> SetupRequest:
    """Tenant ``i``'s build request: its share of the host's cores unless ``--threads`` is given."""
    names = [n for n, _ in spec.tenants]
    return replace(setup_request(spec, names[i], device), threads=spec.threads or tenant_threads(len(names)))


def run_tenants(
    spec: ServeSpec, device: str, store_path: str, say, first: ServingWorker, command: str
) -> tuple[ServeRecord, Any]:
    """Measure the interference matrix of ``spec.tenants``; returns the record and the outcome.

    ``first``: the first tenant's worker, launched, with the run-level prelude (idle baseline, thermal
    warm-up on the first tenant's model) measured in it before any tenant is built
    (`deepgap.serving.serve_run`); a failure to start it is the first tenant's failed set-up.
    """
    names = [n for n, _ in spec.tenants]
    labels = tenant_labels(names)
    rec = ServeRecord(spec=run_spec(spec, device, names), command=command, env={"device": device})
    rec.env = first.env or rec.env
    out = ServeOutcome(None, os.path.abspath(store_path))
    minq, mind = spec.minimums()
    policy = BatchPolicy(
        spec.max_batch or DEFAULT_POLICY[0],
        spec.max_delay_s if spec.max_delay_s is not None else DEFAULT_POLICY[1],
    )
    workers: list[ServingWorker] = []
    reqs, services, rates = [], [], []
    try:
        for i in range(len(names)):
            req = tenant_request(spec, i, device)
            say(
                f"serve: tenant {labels[i]}: building and calibrating batches {', '.join(map(str, req.buckets))}"
            )
            w = first if i == 0 else ServingWorker(device)
            workers.append(w)  # stopped below whatever happens
            try:
                if w.failure is not None:  # the first tenant's worker did not start or answer
                    raise w.failure
                reply = w.setup(req, spec.timeout_s) if i == 0 else w.start_serving(req, spec.timeout_s)
            except (SetupFailed, WorkerLost) as exc:
                status = exc.status.value if isinstance(exc.status, Status) else str(exc.status)
                why = exc.reason.splitlines()[0]
                if status == Status.OOM.value and i:
                    why = f"tenant {labels[i]} did not fit in device memory beside {', '.join(labels[:i])}: {why}"
                rec.levels.append(
                    level_row(
                        req,
                        "server",
                        "setup",
                        None,
                        None,
                        "",
                        spec.seed,
                        None,
                        tenant=labels[i],
                        status=status,
                        reason=why,
                    )
                )
                out.status, out.reason = status, why
                out.lines.append(f"{status}: {why}")
                return rec, out
            reqs.append(req)
            rec.curves += curve_rows(reply, req, labels[i])
            sv = service_of(reply, f"calibration of {labels[i]}")
            services.append(sv)
            pol = BatchPolicy(min(policy.max_batch, sv.max_batch), policy.max_delay_s)
            rates.append(_rate(spec, spec.tenants[i][1], sv, pol, minq, mind))
            say(f"serve: tenant {labels[i]}: {rates[-1]:,.1f} queries/s")
        schedules = [
            arr.poisson(r, arr.n_queries(r, minq, mind), spec.seed + 1000 * i) for i, r in enumerate(rates)
        ]
        matrix: dict[str, dict[str, dict[str, float]]] = {lab: {} for lab in labels}
        for ph in phases(len(names)):
            phase = "+".join(labels[i] for i in ph)
            say(f"serve: phase {phase}")
            start = time.perf_counter() + 1.0
            for i in ph:
                n = len(schedules[i])
                pol = BatchPolicy(min(policy.max_batch, services[i].max_batch), policy.max_delay_s)
                workers[i].send_level(
                    LevelRequest(schedules[i], pol, StopRule(max_time_s=3 * n / rates[i] + 5), start_at=start)
                )
            for i in ph:
                n = len(schedules[i])
                pol = BatchPolicy(min(policy.max_batch, services[i].max_batch), policy.max_delay_s)
                log = workers[i].receive_log(120 + 4 * n / rates[i])
                s = summarize(log, rates[i], spec.slo_s, 0.99, spec.confidence)
                pred = summarize(
                    simulate_alone(schedules[i], pol, services[i], spec.seed),
                    rates[i],
                    spec.slo_s,
                    0.99,
                    spec.confidence,
                )
                rec.levels.append(
                    level_row(
                        reqs[i],
                        "server",
                        "tenant",
                        pol,
                        rates[i],
                        "poisson",
                        spec.seed + 1000 * i,
                        s,
                        pred,
                        log,
                        tenant=labels[i],
                        phase=phase,
                    )
                )
                key = (
                    "alone"
                    if len(ph) == 1
                    else ("all" if len(ph) == len(names) and len(names) > 2 else phase)
                )
                matrix[labels[i]][key] = {
                    "p99_s": s.latency_p99_s,
                    "achieved_qps": s.achieved_qps,
                    "offered_qps": rates[i],
                }
    except (SetupFailed, WorkerLost) as exc:
        status = exc.status.value if isinstance(exc.status, Status) else str(exc.status)
        out.status, out.reason = status, exc.reason.splitlines()[0]
        out.lines.append(f"{status}: {out.reason}")
        rec.levels.append(
            level_row(
                reqs[-1],
                "server",
                "tenant",
                None,
                None,
                "",
                spec.seed,
                None,
                status=status,
                reason=out.reason,
            )
        )
        return rec, out
    finally:
        for w in workers:
            w.stop()
    out.summary["interference"] = matrix
    out.lines += interference_lines(matrix)
    return rec, out


def simulate_alone(times: np.ndarray, policy: BatchPolicy, service, seed: int):
    """The simulator's view of a tenant alone (it knows nothing of its neighbours)."""
    from deepgap.serving.sim import simulate

    return simulate(times, policy, service, seed=seed)


def _rate(spec: ServeSpec, own: float | None, sv, pol: BatchPolicy, minq: int, mind: float) -> float:
    if own:
        return own
    if spec.qps:
        return spec.qps
    if spec.slo_s is None:
        return spec.load * sv.saturation_qps(pol.max_batch)
    load = LoadSettings(
        slo_s=spec.slo_s,
        confidence=spec.confidence,
        min_queries=minq,
        min_duration_s=mind,
        max_queries=20_000,
        seed=spec.seed,
    )
    ceiling = sv.saturation_qps(pol.max_batch) * 1.05
    cap = find_capacity(
        sim_probe(sv, pol, load), pol, spec.slo_s, start_qps=0.6 * ceiling, ceiling_qps=ceiling, rel_tol=0.05
    ).capacity_qps
    return spec.load * (cap if cap > 0 else sv.saturation_qps(pol.max_batch))


def interference_lines(matrix: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """The interference matrix as text: p99 and served rate per tenant and phase."""
    cols = []
    for row in matrix.values():
        cols += [c for c in row if c not in cols]
    head = "tenant".ljust(22) + "".join(c[:24].rjust(26) for c in cols)
    lines = ["interference (p99 ms / served queries/s; × = p99 over alone):", head]
    for lab, row in matrix.items():
        alone = row.get("alone", {}).get("p99_s")
        cells = []
        for c in cols:
            v = row.get(c)
            if v is None:
                cells.append("–".rjust(26))
                continue
            x = f" {v['p99_s'] / alone:.2f}×" if alone and c != "alone" else ""
            cells.append(f"{v['p99_s'] * 1e3:.2f} / {v['achieved_qps']:,.0f}{x}".rjust(26))
        lines.append(lab[:22].ljust(22) + "".join(cells))
    return lines


__all__ = ["interference_lines", "phases", "run_tenants", "tenant_labels", "tenant_request", "tenant_threads"]
