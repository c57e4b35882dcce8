"""An in-process stand-in for the ``ray`` module: enough of its API for `deepgap.fleet.ray_backend`.

Why: Ray is not installed on every machine the tests run on (nor on the GPU machines), and a real
cluster costs seconds to start. This double runs every task and actor method at once, in the
calling thread, with Ray's runtime context (node id, GPU ids) set to where it placed the work, and
keeps score of the actors it created (so a test can check that each device got one and that all
were stopped). ``install(monkeypatch, nodes)`` puts it in ``sys.modules`` as ``ray``.
"""

from __future__ import annotations

import itertools
import sys
import threading
import types
from typing import Any

_here = threading.local()


class NodeAffinitySchedulingStrategy:
    def __init__(self, node_id: str, soft: bool) -> None:
        self.node_id = node_id
        self.soft = soft


class Ref:
    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


class FakeRay(types.ModuleType):
    """The ``ray`` module double; ``nodes`` as `ray.nodes` lists them (``NodeID``, ``Resources``)."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        super().__init__("ray")
        self._nodes = [
            {"Alive": True, "NodeManagerHostname": f"host{i}", "NodeManagerAddress": f"10.0.0.{i}", **n}
            for i, n in enumerate(nodes)
        ]
        self._initialized = False
        self.init_kw: dict[str, Any] = {}  # what `ray.init` was called with
        self._gpus_held: dict[str, set[int]] = {n["NodeID"]: set() for n in self._nodes}
        self._rr = itertools.count()
        self._lock = threading.Lock()
        self.actors: list[ActorHandle] = []
        self.exceptions = types.SimpleNamespace()
        util = types.ModuleType("ray.util")
        strategies = types.ModuleType("ray.util.scheduling_strategies")
        strategies.NodeAffinitySchedulingStrategy = NodeAffinitySchedulingStrategy
        util.scheduling_strategies = strategies
        self.util = util

    # --- connection
    def is_initialized(self) -> bool:
        return self._initialized

    def init(self, **kw: Any) -> None:
        self._initialized = True
        self.init_kw = kw

    def shutdown(self) -> None:
        self._initialized = False

    def nodes(self) -> list[dict[str, Any]]:
        return [dict(n) for n in self._nodes]

    # --- runtime context of the work running now
    def get_runtime_context(self) -> Any:
        return types.SimpleNamespace(get_node_id=lambda: _here.node_id)

    def get_gpu_ids(self) -> list[int]:
        return list(getattr(_here, "gpu_ids", []))

    # --- placement
    def _place(self, opts: dict[str, Any]) -> tuple[str, list[int]]:
        gpus = int(opts.get("num_gpus", 0))
        strategy = opts.get("scheduling_strategy")
        with self._lock:
            candidates = [
                n for n in self._nodes if all(n["Resources"].get(k, 0) > 0 for k in opts.get("resources", {}))
            ]
            if strategy is not None:
                candidates = [n for n in candidates if n["NodeID"] == strategy.node_id]
            start = next(self._rr)
            for i in range(len(candidates)):
                n = candidates[(start + i) % len(candidates)]
                held = self._gpus_held[n["NodeID"]]
                free = [g for g in range(int(n["Resources"].get("GPU", 0))) if g not in held]
                if len(free) >= gpus:
                    return n["NodeID"], free[:gpus]
        raise RuntimeError(f"the fake cluster cannot place {opts}")

    def _run(self, where: tuple[str, list[int]], fn: Any, *args: Any, **kw: Any) -> Ref:
        saved = getattr(_here, "node_id", None), getattr(_here, "gpu_ids", [])
        _here.node_id, _here.gpu_ids = where
        try:
            return Ref(fn(*args, **kw))
        except Exception as exc:  # noqa: BLE001 - Ray hands the task's error to ray.get
            return Ref(error=exc)
        finally:
            _here.node_id, _here.gpu_ids = saved

    # --- API
    def remote(self, target: Any) -> Any:
        return ActorClass(self, target) if isinstance(target, type) else RemoteFunction(self, target)

    def get(self, ref: Ref, timeout: float | None = None) -> Any:
        if ref.error is not None:
            raise ref.error
        return ref.value

    def wait(self, refs: list[Ref], num_returns: int = 1, timeout: float | None = None):
        return list(refs[:num_returns]), list(refs[num_returns:])

    def cancel(self, ref: Ref, force: bool = False) -> None:
        pass

    def kill(self, actor: ActorHandle) -> None:
        with self._lock:
            actor.alive = False
            self._gpus_held[actor.where[0]] -= set(actor.where[1])


class RemoteFunction:
    def __init__(self, ray: FakeRay, fn: Any, opts: dict[str, Any] | None = None) -> None:
        self.ray, self.fn, self.opts = ray, fn, opts or {}

    def options(self, **opts: Any) -> RemoteFunction:
        return RemoteFunction(self.ray, self.fn, {**self.opts, **opts})

    def remote(self, *args: Any, **kw: Any) -> Ref:
        return self.ray._run(self.ray._place(self.opts), self.fn, *args, **kw)


class ActorClass(RemoteFunction):
    def options(self, **opts: Any) -> ActorClass:
        return ActorClass(self.ray, self.fn, {**self.opts, **opts})

    def remote(self, *args: Any, **kw: Any) -> ActorHandle:
        where = self.ray._place(self.opts)
        with self.ray._lock:
            self.ray._gpus_held[where[0]] |= set(where[1])
        handle = ActorHandle(self.ray, where, self.opts)
        ref = self.ray._run(where, self.fn, *args, **kw)
        handle.instance, handle.error = ref.value, ref.error
        self.ray.actors.append(handle)
        return handle


class ActorHandle:
    def __init__(self, ray: FakeRay, where: tuple[str, list[int]], opts: dict[str, Any]) -> None:
        self.ray, self.where, self.opts = ray, where, opts
        self.instance: Any = None
        self.error: BaseException | None = None
        self.alive = True

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("instance", "error"):
            raise AttributeError(name)
        handle = self

        class Method:
            @staticmethod
            def remote(*args: Any, **kw: Any) -> Ref:
                if not handle.alive or handle.error is not None:
                    return Ref(error=handle.error or RuntimeError("ActorDiedError: the actor was killed"))
                return handle.ray._run(handle.where, getattr(handle.instance, name), *args, **kw)

        return Method


def install(monkeypatch: Any, nodes: list[dict[str, Any]]) -> FakeRay:
    """Make ``import ray`` (and ``ray.util.scheduling_strategies``) give a fresh `FakeRay`."""
    fake = FakeRay(nodes)
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "ray.util", fake.util)
    monkeypatch.setitem(sys.modules, "ray.util.scheduling_strategies", fake.util.scheduling_strategies)
    return fake
