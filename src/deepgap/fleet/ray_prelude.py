"""The run-level prelude of a Ray sweep: each device's idle baseline and thermal warm-up, in an actor.

Why actors: the prelude (`deepgap.drive.session.RunSession.prelude`, `deepgap.drive.prelude`) is a
conversation with one worker that owns one device — idle baseline, then the warm-up load, with the
idle power handed to the warm-up — while a Ray task measures one configuration and is gone. So each
device of the matching nodes gets one Ray actor (`PreludeActor`, pinned to its node, one GPU each
with ``num_gpus=1``; one per node for a CPU sweep) that starts a deepgap worker on that device, as a
task does. The driver talks to it through `ActorRunner`, which has the runner methods the prelude
uses, so the driver stores the rows through the run session exactly as for local lanes; the driver
never touches a device.

All devices warm up at once (none cools while another warms); then the actors are stopped, freeing
their devices for the configurations' tasks, and what each device's prelude learnt (idle power,
steady SM clock) goes with every task, which applies the facts of the device Ray gave it
(`device_key`). A device whose actor cannot start within ``start_s`` (busy, or its node died) is left
out of the prelude; its configurations are measured as before, without those facts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any

from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.drive.config import SweepSpec
from deepgap.drive.launcher import PreludeMeasure
from deepgap.measure.telemetry.settings import TelemetrySettings, settings_for

START_S = 120.0  # how long an actor may take to be placed and start its worker
_CLOSE_S = 30.0


def device_key(node_id: str, device: str, gpu_ids: list[str]) -> str:
    """Which device of the cluster: its node and Ray's GPU ids there (``cpu`` for a CPU sweep)."""
    return f"{node_id}/{','.join(gpu_ids) if device.startswith('cuda') and gpu_ids else 'cpu'}"


def lane_name(env: dict[str, Any], node_id: str, device: str, gpu_ids: list[str]) -> str:
    """The lane a progress line and ``extra["lane"]`` show: host, node, GPU."""
    where = f"GPU {','.join(gpu_ids)}" if device.startswith("cuda") else "CPU"
    return f"{env.get('host', '?')} ({node_id[:6]}) {where}"


def slots(nodes: list[dict[str, Any]], device: str) -> list[str]:
    """One node id per device the prelude measures: each GPU of a node, or each node for the CPU."""
    out: list[str] = []
    for n in nodes:
        count = int(n["Resources"].get("GPU", 0)) if device.startswith("cuda") else 1
        out += [n["NodeID"]] * count
    return out


class PreludeActor:
    """Body of the Ray actor: one deepgap worker (`deepgap.drive.runner.SweepRunner`) on this node's device."""

    def __init__(self, spec: dict[str, Any], device: str) -> None:
        import ray

        from deepgap.drive.runner import SweepRunner

        self.runner = SweepRunner(SweepSpec.from_dict(spec), device)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]

    def environment(self) -> tuple[dict[str, Any], str, list[str]]:
        """Start the worker; its fingerprint, this node's id and Ray's GPU ids of this actor."""
        self.runner.start()
        return self.runner.environment(), self.node_id, self.gpu_ids

    def set_context(self, **facts: Any) -> None:
        """Run-level facts for the warm-up's request (the idle power)."""
        self.runner.set_context(**facts)

    def idle_baseline(self, settings: TelemetrySettings) -> dict[str, Any]:
        """The worker's idle baseline."""
        return self.runner.idle_baseline(settings)

    def thermal_warmup(self, cfg_key: str, timeout_s: float) -> Result:
        """The worker's thermal warm-up on ``cfg_key``."""
        return self.runner.thermal_warmup(ConfigSpec.from_key(cfg_key), timeout_s)

    def close(self) -> None:
        """Stop the worker (before the actor is killed, so that no worker outlives it)."""
        self.runner.close()


class ActorRunner:
    """The driver's side of one `PreludeActor`: a `deepgap.drive.launcher.Device` for `RunSession.prelude`.

    A lost actor (its node died, a timeout) becomes a status in the stored summary, as a lost worker
    does in `deepgap.drive.runner.SweepRunner`.
    """

    def __init__(self, ray: Any, actor: Any, sweep: SweepSpec) -> None:
        self.ray = ray
        self.actor = actor
        self.sweep = sweep
        self.context: dict[str, Any] = {}

    def set_context(self, **facts: Any) -> None:  # noqa: D102 - as SweepRunner's
        self.context.update(facts)
        self.ray.get(self.actor.set_context.remote(**facts), timeout=_CLOSE_S)

    def telemetry_settings(self, mode: str | None = None) -> TelemetrySettings | None:  # noqa: D102
        settings = settings_for(self.sweep, self.context)
        return dataclasses.replace(settings, mode=mode) if settings is not None and mode else settings

    def idle_baseline(self, settings: TelemetrySettings) -> dict[str, Any]:  # noqa: D102
        try:
            ref = self.actor.idle_baseline.remote(settings)
            return self.ray.get(ref, timeout=settings.idle_s + 120.0)
        except Exception as exc:  # noqa: BLE001 - a lost actor is a status, as a lost worker
            return {
                "summary": {"status": f"unavailable: the Ray actor was lost ({first_line(exc)})"},
                "samples": [],
            }

    def thermal_warmup(self, cfg: ConfigSpec, timeout_s: float) -> Result:  # noqa: D102
        try:
            return self.ray.get(
                self.actor.thermal_warmup.remote(cfg.key, timeout_s),
                timeout=timeout_s + self.sweep.timeout_s + 60.0,
            )
        except Exception as exc:  # noqa: BLE001
            why = f"the Ray actor was lost ({first_line(exc)})"
            return Result(spec=cfg, status=Status.CRASH, reason=why)


@dataclasses.dataclass
class _Slot:
    actor: Any
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    key: str = ""
    lane: str = ""


@dataclasses.dataclass(eq=False)
class RayPrelude:
    """The prelude actors of one Ray sweep: started with the backend, stopped after the prelude."""

    ray: Any
    sweep: SweepSpec
    nodes: list[dict[str, Any]]
    resources: dict[str, float]
    start_s: float = START_S
    slots: list[_Slot] = dataclasses.field(default_factory=list, init=False)
    left_out: int = dataclasses.field(default=0, init=False)  # devices whose actor did not start in time
    # device_key → idle power, steady clock
    contexts: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict, init=False)

    def start(self) -> None:
        """Place one actor per device of the matching nodes and start each one's worker."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self.ray
        device = "cuda" if self.sweep.device.startswith("cuda") else "cpu"  # Ray sets CUDA_VISIBLE_DEVICES
        cls = ray.remote(PreludeActor)
        actors = []
        for node_id in slots(self.nodes, device):
            pin = NodeAffinitySchedulingStrategy(node_id, soft=False)
            opts: dict[str, Any] = {
                "resources": dict(self.resources),
                "max_restarts": 0,
                "num_cpus": 1,
                "scheduling_strategy": pin,
            }
            if device == "cuda":
                opts["num_gpus"] = 1
            actors.append(cls.options(**opts).remote(self.sweep.to_dict(), device))
        refs = {a.environment.remote(): a for a in actors}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=self.start_s) if refs else ([], [])
        for ref, actor in refs.items():
            try:
                env, node_id, gpu_ids = ray.get(ref, timeout=0) if ref in ready else (None, "", [])
            except Exception:  # noqa: BLE001 - an actor that failed to start is left out
                env = None
            if env is None:
                self.left_out += 1
                _stop(ray, actor)
                continue
            lane = lane_name(env, node_id, device, gpu_ids)
            full = {**env, "lane": lane, "ray_node_id": node_id, "ray_gpu_ids": gpu_ids}
            self.slots.append(_Slot(actor, full, device_key(node_id, device, gpu_ids), lane))

    def first_env(self) -> dict[str, Any] | None:
        """The first started device's fingerprint, or None when no actor started."""
        return self.slots[0].env if self.slots else None

    def run(self, measure: PreludeMeasure, configs: list[ConfigSpec]) -> None:
        """``measure(lane, runner, configs)`` for every device at once, then stop the actors."""
        errors: list[BaseException] = []
        runners = {s.key: ActorRunner(self.ray, s.actor, self.sweep) for s in self.slots}
        device = "cuda" if self.sweep.device.startswith("cuda") else "cpu"  # Ray set CUDA_VISIBLE_DEVICES
        physical = [dataclasses.replace(c, device=device) for c in configs]

        def one(slot: _Slot) -> None:
            try:
                measure(slot.lane, runners[slot.key], physical)
            except Exception as exc:  # noqa: BLE001 - raised below, after every device finished
                errors.append(exc)

        threads = [
            threading.Thread(target=one, args=(s,), name=f"deepgap-prelude-{s.key}", daemon=True)
            for s in self.slots
        ]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            self.contexts = {key: dict(r.context) for key, r in runners.items()}
            self.close()
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Stop every actor's worker, then the actor (frees its device for the tasks)."""
        for s in self.slots:
            _stop(self.ray, s.actor)
        self.slots = []


def _stop(ray: Any, actor: Any) -> None:
    with contextlib.suppress(Exception):  # best effort: the actor may be gone already
        ray.get(actor.close.remote(), timeout=_CLOSE_S)
    with contextlib.suppress(Exception):
        ray.kill(actor)


def first_line(exc: BaseException) -> str:
    """An exception as one short line, ``Type: first line of its message`` (Ray's messages run long)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"
