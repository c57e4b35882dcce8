"""A sweep over a Ray cluster: one Ray task per configuration, placed on any matching node.

Each task asks Ray for one GPU (``num_gpus=1``; Ray sets ``CUDA_VISIBLE_DEVICES`` so ``cuda`` is that
GPU) or, for a CPU configuration, for as many cores as its thread count. On its node the task
starts a fresh deepgap worker process through `deepgap.drive.runner.SweepRunner` — the same measure path,
crash/hang isolation and timeout as on one machine — measures the one configuration, and returns
the `Result` with the node's environment fingerprint (``extra["node_env"]``). The driver (this
process) is the store's only writer.

Failures are split by who caused them. A configuration that crashes, hangs or runs out of memory
is stored with that status by the worker's parent on the node, never retried (it would fail again).
A lost Ray worker or node (`WorkerCrashedError`, `NodeDiedError`, …) is not the configuration's
fault: the driver submits it again, up to ``retries`` times, and Ray places it on any alive
matching node; ``extra["attempts"]`` and ``extra["lost"]`` record it. The driver resubmits itself
(tasks carry ``max_retries=0``) because Ray's own retries are invisible to the caller.

Before the first configuration, every device of the matching nodes measures the run-level prelude
(idle baseline, thermal warm-up) in a Ray actor of its own (`deepgap.fleet.ray_prelude`); the
driver stores it through the run session as for local lanes, and each task applies the facts of
its device (idle power, steady SM clock).

Batch ladders (`deepgap.fleet.common.ladders`) are chained: the next batch of a ladder is submitted
when the previous one finished, so an OOM or a hang skips the larger batches as on one machine,
while different ladders run in parallel across the cluster.

Placement (``--where``) is `deepgap.fleet.ray_placement`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.core.result_details import ResultDetails
from deepgap.drive.config import SweepSpec
from deepgap.drive.launcher import Finished, PreludeMeasure
from deepgap.drive.runner import cascade_reason
from deepgap.fleet.common import ladders, run_env
from deepgap.fleet.ray_placement import import_ray, where_resources
from deepgap.fleet.ray_prelude import RayPrelude, device_key, first_line, lane_name

RETRIES = 2  # a configuration whose worker or node is lost runs at most 1 + RETRIES times
_POLL_S = 2.0
_LOST_ERRORS = (
    "WorkerCrashedError",
    "NodeDiedError",
    "LocalRayletDiedError",
    "ObjectLostError",
    "OutOfMemoryError",
    "ActorDiedError",
)


def measure_config(
    spec: dict[str, Any], cfg_key: str, contexts: dict[str, dict[str, Any]] | None = None
) -> Result:
    """Body of the Ray task: measure one configuration in a fresh deepgap worker on this node.

    ``contexts``: what each device's prelude learnt (`deepgap.fleet.ray_prelude`), by device; the
    task applies those of the device Ray gave it.
    """
    import ray

    from deepgap.drive.runner import SweepRunner

    cfg = ConfigSpec.from_key(cfg_key)
    device = "cuda" if cfg.device.startswith("cuda") else "cpu"  # Ray set CUDA_VISIBLE_DEVICES
    node_id = ray.get_runtime_context().get_node_id()
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    runner = SweepRunner(SweepSpec.from_dict(spec), device)
    runner.set_context(**(contexts or {}).get(device_key(node_id, device, gpu_ids), {}))
    try:
        runner.start()
        env = runner.environment()
        res = next(iter(runner.run([dataclasses.replace(cfg, device=device)])))
    finally:
        runner.close(wait=False)  # its one job is done: no need to wait for a clean interpreter exit
    lane = lane_name(env, node_id, device, gpu_ids)
    res.spec = cfg
    res.details.lane, res.details.node_id = lane, node_id
    res.details.node_env = {**env, "lane": lane, "ray_node_id": node_id, "ray_gpu_ids": gpu_ids}
    return res


@dataclass
class _Job:
    cfg: ConfigSpec
    rest: deque[ConfigSpec]
    attempts: int = 0
    lost: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)


class RayBackend:
    """Runs a sweep's configurations as Ray tasks (a `Launcher`); `results` yields `Finished` items."""

    backend = "ray"

    def __init__(
        self,
        sweep: SweepSpec,
        address: str,
        where: dict[str, str] | None = None,
        retries: int = RETRIES,
        infeasible_grace_s: float = 60.0,
    ) -> None:
        self.sweep = sweep
        self.address = address
        self.where = dict(where or {})
        self.retries = retries
        self.grace_s = infeasible_grace_s
        self.resources: dict[str, float] = {}
        self.matching: list[dict[str, Any]] = []
        self._ray: Any = None
        self._owns = False
        self._pending: dict[Any, _Job] = {}
        self._prelude: RayPrelude | None = None
        self.contexts: dict[str, dict[str, Any]] = {}  # what each device's prelude learnt, by device_key

    def describe(self) -> dict[str, Any]:
        """The fleet settings stored with the run (``--resume`` reuses them)."""
        return {
            "backend": self.backend,
            "ray": self.address,
            "where": self.where,
            "retries": self.retries,
            "nodes": [
                {
                    "node_id": n["NodeID"],
                    "host": n.get("NodeManagerHostname"),
                    "ip": n.get("NodeManagerAddress"),
                    "resources": {k: v for k, v in n["Resources"].items() if not k.startswith("node:")},
                }
                for n in self.matching
            ],
        }

    def _connect(self) -> None:
        ray = self._ray = import_ray()
        if ray.is_initialized():
            return
        kw: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
        if self.address == "local":
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            kw["include_dashboard"] = False
            # Ray starts its workers at nice 15, and the deepgap worker a task spawns inherits it: a measurement
            # would run below every ordinary process on the host (beside two busy loops it starved for minutes)
            kw["_system_config"] = {"worker_niceness": 0}
        else:
            kw["address"] = self.address
        try:
            ray.init(**kw)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UsageError(
                f"cannot connect to the Ray cluster at {self.address!r} ({str(exc).splitlines()[0]})",
                "start one with `ray start --head`, or pass --ray local / --ray HOST:PORT",
            ) from None
        self._owns = True

    def alive_nodes(self) -> list[dict[str, Any]]:
        """The cluster's alive nodes as `ray.nodes` describes them."""
        return [n for n in self._ray.nodes() if n.get("Alive")]

    def prepare(self, sweep: SweepSpec, resumed: bool = False) -> str:
        """Connect, check ``--where`` and the device against the cluster; returns the logical device.

        Raises:
            UsageError: no cluster, no matching node, or a device/threads request no node can meet.
        """
        self._connect()
        nodes = self.alive_nodes()
        self.resources = where_resources(self.where, nodes)
        self.matching = [n for n in nodes if all(n["Resources"].get(k, 0) > 0 for k in self.resources)]
        if not self.matching:
            raise UsageError("no alive Ray node matches every --where filter", "relax --where")
        has_gpu = any(n["Resources"].get("GPU", 0) >= 1 for n in self.matching)
        dev = sweep.device
        if dev == "auto":
            dev = "cuda" if has_gpu else "cpu"
        if dev.startswith("cuda:") and not resumed:
            raise UsageError(
                f"--device {dev} picks a GPU, but with --ray Ray assigns them", "use --device cuda or auto"
            )
        if dev.startswith("cuda") and not has_gpu:
            raise UsageError(
                "--device cuda but no matching Ray node has a GPU", "add GPU nodes or use --device cpu"
            )
        if dev == "cpu":
            if not sweep.threads:
                raise UsageError(
                    "a CPU sweep over Ray needs --threads, so that each task reserves its cores",
                    "pass e.g. --threads 1,2",
                )
            most = max(int(n["Resources"].get("CPU", 0)) for n in self.matching)
            if max(sweep.threads) > most:
                raise UsageError(
                    f"--threads {max(sweep.threads)} but no matching Ray node has that many CPUs",
                    f"use at most {most} threads",
                )
        self.sweep = sweep.replace(device=dev)
        return dev

    def device_names(self) -> list[str]:
        """The GPU types (or ``CPU``) of the matching nodes, for the run's summary."""
        if not self.sweep.device.startswith("cuda"):
            return ["CPU"]
        types = {
            k.split(":", 1)[1]
            for n in self.matching
            for k in n["Resources"]
            if k.startswith("accelerator_type:")
        }
        return sorted(types) or ["GPU"]

    def start(self) -> None:
        """Start the prelude's actors, one per device of the matching nodes (`deepgap.fleet.ray_prelude`).

        The configurations need nothing started: Ray starts a worker per task. A sweep whose prelude
        measures nothing (telemetry off, or ``--idle-time 0`` without a thermal warm-up) starts none:
        each actor is a process of its own, with a worker to start, on every device.
        """
        s = self.sweep
        if not s.telemetry or (s.idle_s <= 0 and not s.thermal_warmup):
            return
        self._prelude = RayPrelude(self._ray, self.sweep, self.matching, self.resources)
        self._prelude.start()

    def environment(self) -> dict[str, Any] | None:
        """The run's fingerprint: the first prelude device's, plus the fleet summary (`run_env`).

        None when no prelude actor runs: the run row then waits for the first result's node.
        """
        first = self._prelude.first_env() if self._prelude is not None else None
        return run_env(self, first) if first is not None else None

    def plan_cards(self, configs: list[ConfigSpec]) -> list[ConfigSpec]:
        """The configurations as planned: Ray places each on any matching device (no ``--every-card``)."""
        return configs

    def restart(self) -> None:
        """Nothing to restart: every configuration's task starts a fresh worker on its node."""

    def prelude(self, measure: PreludeMeasure, configs: Sequence[ConfigSpec]) -> None:
        """``measure(lane, runner, configs)`` on every device at once, in its actor; then free the devices.

        The run-level prelude (`deepgap.drive.session.RunSession.prelude`), as the local lanes get it; what
        it learns goes with every task (``contexts``). Nothing, when there is nothing to measure
        (`start`).
        """
        if self._prelude is None:
            return
        try:
            self._prelude.run(measure, list(configs))
        finally:
            self.contexts = self._prelude.contexts

    def _options(self, cfg: ConfigSpec) -> dict[str, Any]:
        opts: dict[str, Any] = {
            "max_retries": 0,
            "resources": dict(self.resources),
            "name": f"deepgap {cfg.label()}",
        }
        if cfg.device.startswith("cuda"):
            opts.update(num_gpus=1, num_cpus=1)
        else:
            opts.update(num_cpus=cfg.threads or 1)
        return opts

    def results(self, configs: list[ConfigSpec]) -> Iterator[Finished]:
        """Submit the first batch of every ladder, then chain; yields results as they arrive.

        Raises:
            UsageError: work is left that no alive node can run (the run can be resumed later).
        """
        ray = self._ray
        remote = ray.remote(measure_config)
        spec = self.sweep.to_dict()
        lost_types = tuple(
            t for t in (getattr(ray.exceptions, n, None) for n in _LOST_ERRORS) if t is not None
        )
        pending = self._pending

        def submit(job: _Job) -> None:
            job.attempts += 1
            job.options = self._options(job.cfg)
            pending[remote.options(**job.options).remote(spec, job.cfg.key, self.contexts)] = job

        for ladder in ladders(configs):
            submit(_Job(ladder[0], deque(ladder[1:])))
        stuck_since: float | None = None
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_S)
            if not ready:
                stuck_since = self._check_feasible(stuck_since)
                continue
            stuck_since = None
            job = pending.pop(ready[0])
            try:
                res: Result = ray.get(ready[0])
            except lost_types as exc:
                job.lost.append(first_line(exc))
                if len(job.lost) <= self.retries:
                    submit(job)
                    continue
                res = Result(
                    spec=job.cfg,
                    status=Status.CRASH,
                    reason=f"its Ray worker or node was lost {len(job.lost)} times; last: {job.lost[-1]}",
                )
            except Exception as exc:  # noqa: BLE001 - the task itself raised (e.g. deepgap missing on the node)
                res = Result(spec=job.cfg, status=Status.ERROR, reason=f"Ray task failed: {first_line(exc)}")
            res.spec = job.cfg
            res.details.attempts = job.attempts
            if job.lost:
                res.details.lost = job.lost
            lane = str(res.details.lane or "ray")
            yield Finished(lane, res, res.details.node_env or {})
            why = cascade_reason(res.spec.batch_size, res.status)
            if why:
                d = res.details
                for cfg in job.rest:
                    where = ResultDetails(lane=d.lane, node_id=d.node_id, node_env=d.node_env)
                    yield Finished(
                        lane,
                        Result(spec=cfg, status=Status.SKIPPED, reason=why, details=where),
                        d.node_env or {},
                    )
            elif job.rest:
                submit(_Job(job.rest.popleft(), job.rest))

    def _check_feasible(self, since: float | None) -> float | None:
        """Give up (with a resumable error) when no alive node can run some pending task for a while."""
        nodes = self.alive_nodes()

        def fits(opts: dict[str, Any], res: dict[str, float]) -> bool:
            need = {
                "GPU": opts.get("num_gpus", 0),
                "CPU": opts.get("num_cpus", 1),
                **opts.get("resources", {}),
            }
            return all(res.get(k, 0) >= v for k, v in need.items() if v)

        stuck = [j for j in self._pending.values() if not any(fits(j.options, n["Resources"]) for n in nodes)]
        if not stuck:
            return None
        now = time.monotonic()
        if since is None:
            return now
        if now - since >= self.grace_s:
            raise UsageError(
                f"no alive Ray node can run {len(stuck)} remaining configuration(s) (e.g. {stuck[0].cfg.label()})",
                "add a matching node (ray start --address=…) and continue with `deepgap run --resume`",
            )
        return since

    def close(self) -> None:
        """Cancel what is still pending; disconnect if this process connected."""
        ray = self._ray
        if ray is None:
            return
        if self._prelude is not None:
            self._prelude.close()
        for ref in list(self._pending):
            with contextlib.suppress(Exception):  # best effort at shutdown
                ray.cancel(ref, force=True)
        self._pending.clear()
        if self._owns and ray.is_initialized():
            ray.shutdown()
