"""Which local devices a multi-device sweep uses: ``--devices cuda:0,cuda:1`` or ``--devices all``.

A `Lane` is one place that measures one configuration at a time: a GPU (``cuda:1``) or, for tests
and demonstrations on a machine without GPUs, a *fake* device ``fake-cpu:N`` — a CPU worker that
pretends to be device N. Fake lanes share the CPU, so their numbers disturb each other; they exist
so the scheduler can be exercised for real on CPU-only CI (`fake_lanes`). The device list is
injectable: `scheduler.LocalScheduler` takes lanes, never probes for them itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from deepgap.core.errors import UsageError
from deepgap.drive.session import visible_cuda_count

_CUDA_RE = re.compile(r"^cuda(?::(\d+))?$")
_FAKE_RE = re.compile(r"^fake-cpu:(\d+)$")


@dataclass(frozen=True)
class Lane:
    """One device that runs one configuration at a time.

    Attributes:
        name: what progress lines and ``extra["lane"]`` show, e.g. ``cuda:1`` or ``fake-cpu:0``.
        torch_device: the device the worker measures on (``cuda:1``; ``cpu`` for a fake lane).
    """

    name: str
    torch_device: str

    @property
    def kind(self) -> str:
        """``cuda`` or ``cpu``."""
        return "cuda" if self.torch_device.startswith("cuda") else "cpu"


def fake_lanes(n: int) -> list[Lane]:
    """``n`` fake devices backed by CPU workers (tests and demonstrations only)."""
    return [Lane(f"fake-cpu:{i}", "cpu") for i in range(n)]


def parse_devices(
    spec: str | list[str] | list[Lane] | tuple[str, ...], count: Callable[[], int] = visible_cuda_count
) -> list[Lane]:
    """Turn ``all`` / ``cuda:0,cuda:1`` / ``fake-cpu:0,fake-cpu:1`` (or a list of those) into lanes.

    Args:
        spec: the ``--devices`` text, the API's list of names, or a list of `Lane` (used as is).
        count: how many CUDA devices are visible (injectable for tests).

    Raises:
        UsageError: unknown names, a GPU listed twice (two configurations on one GPU would disturb
            each other's numbers), an absent GPU, or CUDA and fake devices mixed.
    """
    if not isinstance(spec, str) and spec and all(isinstance(t, Lane) for t in spec):
        return list(spec)  # injected lanes (tests): taken as they are
    items = [str(t).strip() for t in (spec.split(",") if isinstance(spec, str) else spec) if str(t).strip()]
    if not items:
        raise UsageError("--devices is empty", "pass --devices all or e.g. --devices cuda:0,cuda:1")
    if items == ["all"]:
        n = count()
        if n == 0:
            raise UsageError(
                "--devices all but no CUDA GPU is visible here", "drop --devices (or use --device cpu)"
            )
        return [Lane(f"cuda:{i}", f"cuda:{i}") for i in range(n)]
    lanes: list[Lane] = []
    for item in items:
        m = _CUDA_RE.match(item)
        if m:
            idx = int(m.group(1) or 0)
            lanes.append(Lane(f"cuda:{idx}", f"cuda:{idx}"))
        elif _FAKE_RE.match(item):
            lanes.append(Lane(item, "cpu"))
        elif item == "cpu":
            raise UsageError(
                "--devices spreads a sweep over GPUs; a CPU is one device",
                "use --device cpu (and --threads to sweep cores)",
            )
        else:
            raise UsageError(
                f"unknown device {item!r} in --devices", "use all, or cuda:N names like cuda:0,cuda:1"
            )
    names = [lane.name for lane in lanes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(
            f"--devices lists {', '.join(dup)} more than once",
            "list each GPU once: two configurations on one GPU would disturb each other's numbers",
        )
    kinds = {lane.kind for lane in lanes}
    if len(kinds) > 1:
        raise UsageError("--devices mixes CUDA and fake CPU devices", "use only cuda:N names")
    if kinds == {"cuda"}:
        n = count()
        bad = [lane.name for lane in lanes if int(lane.name.split(":")[1]) >= n]
        if bad:
            raise UsageError(
                f"--devices names {', '.join(bad)} but {n} GPU(s) are visible",
                f"use cuda:0..cuda:{n - 1}" if n else "drop --devices (no GPU is visible)",
            )
    return lanes


def logical_device(lanes: list[Lane], requested: str, resumed: bool = False) -> str:
    """The device written into every configuration (and its store key) of a multi-device sweep.

    The key must not depend on which lane measured a configuration, or ``--resume`` on another
    lane would measure it twice; the physical device is kept in ``extra["lane"]``.

    Args:
        lanes: the sweep's lanes.
        requested: the spec's ``device`` (``auto`` for a new sweep; a resumed run's stored device).
        resumed: whether ``requested`` comes from a stored run (a one-machine run on ``cuda:N`` may
            be finished over several GPUs; its keys keep ``cuda:N``).
    """
    kind = lanes[0].kind
    if requested == "auto":
        return kind
    if kind == "cuda" and (requested == "cuda" or (resumed and _CUDA_RE.match(requested))):
        return requested
    if kind == "cpu" and requested == "cpu":
        return "cpu"
    raise UsageError(
        f"--device {requested} does not fit --devices {','.join(lane.name for lane in lanes)}",
        "drop --device: --devices picks the devices",
    )
