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
from deepgap.core.stats import P99_MIN_N
from deepgap.drive.handle import WorkerLost
from deepgap.serving.capacity.search import LoadSettings, find_capacity, sim_probe
from deepgap.serving.records.storage import ServeRecord, keep_partial
from deepgap.serving.run.process import LevelRequest, ServingWorker, SetupFailed, SetupRequest
from deepgap.serving.run.rows import (
    ServeOutcome,
    curve_rows,
    level_row,
    run_spec,
    service_of,
    setup_request,
)
from deepgap.serving.run.spec import DEFAULT_POLICY, ServeSpec
from deepgap.serving.sim import arrivals as arr
from deepgap.serving.sim.batcher import BatchPolicy, StopRule
from deepgap.serving.sim.log import summarize


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
    (`deepgap.serving.run.serve_run`); a failure to start it is the first tenant's failed set-up.
    """
    names = [n for n, _ in spec.tenants]
    t = _Tenants(spec, tenant_labels(names), first, device)
    rec = ServeRecord(spec=run_spec(spec, device, names), command=command, env={"device": device})
    rec.env = first.env or rec.env
    out = ServeOutcome(None, os.path.abspath(store_path))
    try:
        for i in range(len(names)):
            req = tenant_request(spec, i, device)
            try:
                reply = t.start(i, req, say)
            except (SetupFailed, WorkerLost) as exc:
                why = exc.reason.splitlines()[0]
                if _status(exc) == Status.OOM.value and i:
                    why = f"tenant {t.labels[i]} did not fit in device memory beside {', '.join(t.labels[:i])}: {why}"
                _failed(rec, out, req, "setup", exc, spec.seed, why, tenant=t.labels[i])
                return rec, out
            t.add(i, req, reply, rec, say)
        schedules = [
            arr.poisson(r, arr.n_queries(r, *t.minimums), spec.seed + 1000 * i) for i, r in enumerate(t.rates)
        ]
        matrix: dict[str, dict[str, dict[str, float]]] = {lab: {} for lab in t.labels}
        for ph in phases(len(names)):
            t.phase(ph, schedules, rec, matrix, say)
    except (SetupFailed, WorkerLost) as exc:
        _failed(rec, out, t.reqs[-1], "tenant", exc, spec.seed, exc.reason.splitlines()[0])
        return rec, out
    except KeyboardInterrupt as exc:
        keep_partial(exc, rec)
        raise
    finally:
        for w in t.workers:
            w.stop()
    out.summary["interference"] = matrix
    out.lines += interference_lines(matrix)
    return rec, out


def _status(exc: SetupFailed | WorkerLost) -> str:
    return exc.status.value if isinstance(exc.status, Status) else str(exc.status)


def _failed(rec, out, req: SetupRequest, purpose: str, exc, seed: int, why: str, tenant: str = "") -> None:
    """A failed set-up or phase: its row (status and reason) and the outcome's status."""
    status = _status(exc)
    rec.levels.append(
        level_row(
            req, "server", purpose, None, None, "", seed, None, tenant=tenant, status=status, reason=why
        )
    )
    out.status, out.reason = status, why
    out.lines.append(f"{status}: {why}")


class _Tenants:
    """The tenants of one run as they are built: their workers, requests, services and offered rates."""

    def __init__(self, spec: ServeSpec, labels: list[str], first: ServingWorker, device: str) -> None:
        self.spec, self.labels, self.first, self.device = spec, labels, first, device
        self.minimums = spec.minimums()
        self.policy = BatchPolicy(
            spec.max_batch or DEFAULT_POLICY[0],
            spec.max_delay_s if spec.max_delay_s is not None else DEFAULT_POLICY[1],
        )
        self.workers: list[ServingWorker] = []
        self.reqs: list[SetupRequest] = []
        self.services: list[Any] = []
        self.rates: list[float] = []

    def policy_of(self, i: int) -> BatchPolicy:
        """Tenant ``i``'s batching policy: the run's, capped at its largest calibrated batch."""
        return BatchPolicy(min(self.policy.max_batch, self.services[i].max_batch), self.policy.max_delay_s)

    def start(self, i: int, req: SetupRequest, say) -> Any:
        """Start tenant ``i``'s worker (the first is given), build and calibrate it: the worker's reply."""
        say(
            f"serve: tenant {self.labels[i]}: building and calibrating batches {', '.join(map(str, req.buckets))}"
        )
        w = self.first if i == 0 else ServingWorker(self.device)
        self.workers.append(w)  # stopped by the caller whatever happens
        if w.failure is not None:  # the first tenant's worker did not start or answer
            raise w.failure
        t = self.spec.timeout_s
        return w.setup(req, t, say) if i == 0 else w.start_serving(req, t, say)

    def add(self, i: int, req: SetupRequest, reply: Any, rec: ServeRecord, say) -> None:
        """Tenant ``i`` built: its curves, its service and its offered rate."""
        self.reqs.append(req)
        rec.curves += curve_rows(reply, req, self.labels[i])
        self.services.append(service_of(reply, f"calibration of {self.labels[i]}"))
        minq, mind = self.minimums
        self.rates.append(
            _rate(self.spec, self.spec.tenants[i][1], self.services[i], self.policy_of(i), minq, mind)
        )
        say(f"serve: tenant {self.labels[i]}: {self.rates[-1]:,.1f} queries/s")

    def phase(self, ph, schedules, rec: ServeRecord, matrix, say) -> None:
        """Run the tenants of phase ``ph`` together from one start; their rows and matrix cells."""
        spec, n_all = self.spec, len(self.labels)
        phase = "+".join(self.labels[i] for i in ph)
        say(f"serve: phase {phase}")
        start = time.perf_counter() + 1.0
        for i in ph:
            n = len(schedules[i])
            stop = StopRule(max_time_s=3 * n / self.rates[i] + 5)
            self.workers[i].send_level(LevelRequest(schedules[i], self.policy_of(i), stop, start_at=start))
        for i in ph:
            pol, rate = self.policy_of(i), self.rates[i]
            log = self.workers[i].receive_log(120 + 4 * len(schedules[i]) / rate)
            s = summarize(log, rate, spec.slo_s, 0.99, spec.confidence)
            alone = simulate_alone(schedules[i], pol, self.services[i], spec.seed)
            pred = summarize(alone, rate, spec.slo_s, 0.99, spec.confidence)
            seed = spec.seed + 1000 * i
            row = level_row(
                self.reqs[i],
                "server",
                "tenant",
                pol,
                rate,
                "poisson",
                seed,
                s,
                pred,
                log,
                self.labels[i],
                phase,
            )
            rec.levels.append(row)
            key = "alone" if len(ph) == 1 else ("all" if len(ph) == n_all and n_all > 2 else phase)
            matrix[self.labels[i]][key] = {
                "p99_s": s.latency_p99_s,
                "max_s": s.latency_max_s,
                "n": s.n,
                "achieved_qps": s.achieved_qps,
                "offered_qps": rate,
            }


def simulate_alone(times: np.ndarray, policy: BatchPolicy, service, seed: int):
    """The simulator's view of a tenant alone (it knows nothing of its neighbours)."""
    from deepgap.serving.sim.simulator import simulate

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
    """The interference matrix as text: each tenant's tail and served rate per phase.

    A tail is a p99 where the phase served ≥ `P99_MIN_N` requests, else their max ("max 3.10"); "×" (p99
    over alone) only where both phases support a p99.
    """
    cols = []
    for row in matrix.values():
        cols += [c for c in row if c not in cols]
    head = "tenant".ljust(22) + "".join(c[:24].rjust(26) for c in cols)
    lines = [
        f"interference (tail ms: p99 where n ≥ {P99_MIN_N}, else max / served queries/s; × = p99 over alone):",
        head,
    ]
    for lab, row in matrix.items():
        alone = row.get("alone", {})
        a_p99 = alone.get("p99_s") if alone.get("n", P99_MIN_N) >= P99_MIN_N else None
        cells = []
        for c in cols:
            v = row.get(c)
            if v is None:
                cells.append("–".rjust(26))
                continue
            p99 = v.get("n", P99_MIN_N) >= P99_MIN_N  # a matrix from before n was kept: as it was printed
            tail = f"{v['p99_s'] * 1e3:.2f}" if p99 else f"max {v['max_s'] * 1e3:.2f}"
            x = f" {v['p99_s'] / a_p99:.2f}×" if a_p99 and p99 and c != "alone" else ""
            cells.append(f"{tail} / {v['achieved_qps']:,.0f}{x}".rjust(26))
        lines.append(lab[:22].ljust(22) + "".join(cells))
    return lines
