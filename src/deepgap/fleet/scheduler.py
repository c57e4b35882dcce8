"""Several devices of one host: one `SweepRunner` per device, each in its own thread (a `Launcher`).

Policy, and why:

- Each lane (device) owns one `deepgap.drive.runner.SweepRunner`, hence one worker process pinned to that
  device, restarted on failure exactly as on one machine. A lane measures one configuration at a
  time, so two configurations never share a GPU (they would disturb each other's numbers).
- Work is a queue of batch *ladders* (`deepgap.fleet.common.ladders`) in plan order. An idle lane
  takes the next whole ladder, so the OOM/timeout cascade of a ladder still works (it runs inside
  `SweepRunner.run`) and a model is built once per lane for all its batches. The price: a sweep
  with fewer ladders than devices leaves devices idle — the paper grid has six ladders (three
  models × two precisions), ``--sweeps N`` multiplies them.
- Configurations keep the *logical* device (``cuda``) in their store key, whichever GPU measured
  them, so ``--resume`` is exact on any set of GPUs; the lane goes to ``extra["lane"]`` and the
  lane's environment fingerprint to ``extra["node_env"]``.
- Lane threads never touch the store: they put items on a queue that the calling thread consumes
  (the driver is the store's only writer).

A lane whose worker cannot be restarted stops; its unfinished ladder goes back to the queue for the
other lanes. The runner is injectable (``runner_factory``) so the policy is tested with fake runners.

``every_card`` (``deepgap run --devices all --every-card``): every configuration is measured on every
lane, to show the card-to-card spread (`deepgap.analysis.cards`). `plan_cards` gives lane ``i`` its own
copies with sweep passes ``i·S … i·S+S−1`` (S = ``--sweeps``), so each card's measurement has its own
store key and ``--resume`` stays exact; each copy is pinned to its lane (a dead lane's copies are left for
``--resume``, never measured on another card). The card itself is in each result's ``node_env``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from deepgap.core.errors import UsageError
from deepgap.core.events import Event
from deepgap.core.records import ConfigSpec, Result
from deepgap.drive.config import SweepSpec
from deepgap.drive.launcher import Device, Finished, PreludeMeasure, Started
from deepgap.drive.runner import SweepRunner
from deepgap.fleet.common import ladders, run_env
from deepgap.fleet.devices import Lane, logical_device


class Runner(Device, Protocol):
    """What a lane needs from `deepgap.drive.runner.SweepRunner` (its prelude too: a `Device`)."""

    def start(self) -> Any: ...  # noqa: D102

    def environment(self) -> dict[str, Any]: ...  # noqa: D102

    def run(self, configs: list[ConfigSpec], on_event: Callable[[Event], None]) -> Iterator[Result]: ...  # noqa: D102

    def restart(self) -> None: ...  # noqa: D102

    def close(self) -> None: ...  # noqa: D102


RunnerFactory = Callable[[SweepSpec, str], Runner]


class LocalScheduler:
    """Spreads configurations over ``lanes``; `results` yields `Started`/`Finished` items."""

    backend = "devices"

    def __init__(
        self,
        sweep: SweepSpec,
        lanes: list[Lane],
        runner_factory: RunnerFactory = SweepRunner,
        every_card: bool = False,
    ) -> None:
        self.sweep = sweep
        self.lanes = lanes
        self.every_card = every_card
        self.factory = runner_factory
        self.runners: dict[str, Runner] = {}
        self.envs: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._cond = threading.Condition()

    def describe(self) -> dict[str, Any]:
        """The fleet settings stored with the run (``--resume`` reuses them)."""
        out: dict[str, Any] = {"backend": self.backend, "devices": [lane.name for lane in self.lanes]}
        if self.every_card:
            out["every_card"] = True
        return out

    def prepare(self, sweep: SweepSpec, resumed: bool = False) -> str:
        """The logical device the sweep's store keys name (`deepgap.fleet.devices.logical_device`)."""
        return logical_device(self.lanes, sweep.device, resumed)

    def plan_cards(self, configs: list[ConfigSpec]) -> list[ConfigSpec]:
        """With ``every_card``: each configuration once per lane, lane ``i`` on sweeps ``i·S + s``; else as is."""
        if not self.every_card:
            return configs
        n = self.sweep.sweeps
        return [
            dataclasses.replace(c, sweep=i * n + c.sweep) for i in range(len(self.lanes)) for c in configs
        ]

    def _pinned_lane(self, cfg: ConfigSpec) -> str:
        return self.lanes[min(cfg.sweep // self.sweep.sweeps, len(self.lanes) - 1)].name

    def start(self) -> None:
        """Start every lane's worker in parallel and read its fingerprint.

        Raises:
            UsageError: a device cannot be used (nothing is written then).
        """

        def start_one(lane: Lane) -> tuple[Lane, dict[str, Any]]:
            runner = self.factory(self.sweep, lane.torch_device)
            self.runners[lane.name] = runner
            runner.start()
            return lane, runner.environment()

        with ThreadPoolExecutor(max_workers=len(self.lanes)) as pool:
            futures = [pool.submit(start_one, lane) for lane in self.lanes]
            errors = []
            for fut in futures:
                try:
                    lane, env = fut.result()
                    self.envs[lane.name] = {**env, "lane": lane.name}
                except Exception as exc:  # noqa: BLE001 - reported below, after every lane tried
                    errors.append(exc)
        if errors:
            self.close()
            raise (
                errors[0]
                if isinstance(errors[0], UsageError)
                else UsageError(f"a device of --devices could not start: {errors[0]}", "check `deepgap env`")
            )

    def environment(self) -> dict[str, Any]:
        """The run's fingerprint: the first lane's, plus the fleet summary (`run_env`)."""
        return run_env(self, self.envs[self.lanes[0].name])

    def prelude(self, measure: PreludeMeasure, configs: Sequence[ConfigSpec]) -> None:
        """``measure(lane, runner, configs on that lane's device)`` on every lane at once.

        The run-level prelude (`deepgap.drive.session.RunSession.prelude`): each device's own idle
        baseline and thermal warm-up, all lanes together so none cools while another warms.
        """
        errors: list[BaseException] = []

        def one(lane: Lane) -> None:
            try:
                physical = [dataclasses.replace(c, device=lane.torch_device) for c in configs]
                measure(lane.name, self.runners[lane.name], physical)
            except Exception as exc:  # noqa: BLE001 - raised below, after every lane finished
                errors.append(exc)

        threads = [
            threading.Thread(target=one, args=(lane,), name=f"deepgap-prelude-{lane.name}", daemon=True)
            for lane in self.lanes
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def device_names(self) -> list[str]:
        """Each lane's device name (for the run's summary)."""
        return [str(self.envs[lane.name].get("device_name", lane.name)) for lane in self.lanes]

    def results(self, configs: list[ConfigSpec]) -> Iterator[Started | Finished]:
        """Measure ``configs`` over the lanes; yields in the calling thread, in completion order.

        Raises:
            UsageError: every lane failed with work left (the run can be resumed).
        """
        work = _Ladders(self, configs)
        items: queue.Queue[tuple[str, Any]] = queue.Queue()

        def lane_loop(lane: Lane) -> None:
            runner = self.runners[lane.name]
            env = self.envs[lane.name]
            try:
                while (ladder := work.take(lane.name)) is not None:
                    physical = [dataclasses.replace(c, device=lane.torch_device) for c in ladder]
                    back = dict(zip(physical, ladder, strict=True))
                    done = 0

                    def started(ev: Event, back=back) -> None:
                        if ev.result is None:
                            items.put(("item", Started(lane.name, back[ev.spec])))

                    try:
                        for res in runner.run(physical, started):
                            res.spec = back[res.spec]
                            res.details.lane = lane.name
                            res.details.node_env = env
                            done += 1
                            items.put(("item", Finished(lane.name, res, env)))
                            if self._stop.is_set():
                                return
                    except Exception:
                        work.settle(lane.name, ladder[done:])
                        raise
                    work.settle(lane.name, [])
            except Exception as exc:  # noqa: BLE001 - a dead lane is reported, the others go on
                items.put(("lane_failed", (lane.name, exc)))
            finally:
                items.put(("lane_done", lane.name))

        self._threads = [
            threading.Thread(target=lane_loop, args=(lane,), name=f"deepgap-lane-{lane.name}", daemon=True)
            for lane in self.lanes
        ]
        for t in self._threads:
            t.start()
        live = len(self._threads)
        failures: list[tuple[str, BaseException]] = []
        while live:
            kind, payload = items.get()
            if kind == "item":
                yield payload
            elif kind == "lane_failed":
                failures.append(payload)
            else:
                live -= 1
        left = work.left()
        if left and failures and not self._stop.is_set():
            name, exc = failures[0]
            raise UsageError(
                f"device {name} failed ({exc}); {left} configuration(s) were not measured",
                "fix the device and continue with `deepgap run --resume`",
            )

    def restart(self) -> None:
        """Stop every lane's worker; each lane's next configuration starts a fresh one."""
        for runner in self.runners.values():
            runner.restart()

    def close(self) -> None:
        """Stop handing out work and stop every worker."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for runner in self.runners.values():
            with contextlib.suppress(Exception):  # best effort at shutdown
                runner.close()
        for t in self._threads:
            t.join(timeout=15)


class _Ladders:
    """The ladders of one `LocalScheduler.results` call, handed to lanes as they ask (thread-safe).

    Shared ladders go to whichever lane asks; with ``every_card`` each lane has its own (its sweeps say
    which). A failing lane gives the unmeasured rest of its ladder back, in front, for another lane (or
    ``--resume``).
    """

    def __init__(self, sched: LocalScheduler, configs: list[ConfigSpec]) -> None:
        self.sched, self.every_card, self.cond = sched, sched.every_card, sched._cond
        self.shared: deque[list[ConfigSpec]] = deque()
        self.own: dict[str, deque[list[ConfigSpec]]] = {lane.name: deque() for lane in sched.lanes}
        for ladder in ladders(configs):
            (self.own[sched._pinned_lane(ladder[0])] if self.every_card else self.shared).append(ladder)
        self.outstanding = len(self.shared)  # shared ladders queued or in flight

    def take(self, lane: str) -> list[ConfigSpec] | None:
        """The next ladder for ``lane``, waiting while another lane may give one back; None: none left."""
        with self.cond:
            while not self.sched._stop.is_set():
                work = self.own[lane] if self.every_card else self.shared
                if work:
                    return work.popleft()
                if self.every_card or self.outstanding == 0:
                    return None
                self.cond.wait(timeout=1.0)
            return None

    def settle(self, lane: str, rest: list[ConfigSpec]) -> None:
        """A ladder finished (``rest`` empty) or failed with ``rest`` unmeasured, which goes back in front."""
        with self.cond:
            if rest:
                (self.own[lane] if self.every_card else self.shared).appendleft(rest)
            else:
                self.outstanding -= 1
            self.cond.notify_all()

    def left(self) -> int:
        """Configurations no lane measured."""
        return sum(len(ladder) for work in (self.shared, *self.own.values()) for ladder in work)
