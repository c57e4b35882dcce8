"""The host CPU's cached artifacts, built beside the prelude in CPU worker processes of their own.

Why: the default GPU run's host-CPU part quantizes each ResNet for ONNX Runtime (export and int8
calibration: 51 s of the main job's 612 s on one H200, from cold caches, results/h200/session14), one
model after another, after the GPU part. The prelude before the GPU part (idle baseline, thermal warm-up:
55 s there) times nothing on the CPU, so those builds overlap it, one worker process per artifact (niced:
`deepgap.measure.configuration.prepare_only`); the CPU part's measurements then find them cached.

Nothing timed overlaps them: `Background.finish` waits for every build before the first configuration is
measured, and the run's log says how long each took and how long it waited. A build that fails here
changes nothing: the configuration's own measurement builds again and stores any failure as its status.

Each build gets its share of the cores (`build_threads`): torch's threads and ONNX Runtime's calibration
session (`engines.ort_quant.calibration_threads`). Left at their defaults, each process took every core
for torch and ORT pinned a calibration thread to every core, three to a core with three builds, and the
builds took 87–102 s beside a 50–66 s prelude on one H200's 16-core host (sessions 22 and 23), where one
after another they had taken 51 s (session 14). The thread count is in no cache key and changes no
artifact's bytes (an artifact is the same file whichever process builds it).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deepgap.core.records import ConfigSpec
from deepgap.drive.runner import SweepRunner

# Engines whose set-up writes a cache that every batch size of a model reuses (ONNX export + int8 model).
ARTIFACT_ENGINES = frozenset({"onnxruntime"})
CORES_PER_BUILD = 4  # at most one build process per 4 cores: calibration itself uses every core it gets


def build_threads(cores: int, builds: int) -> int:
    """Each build process's threads: an equal share of ``cores``, so that together they never oversubscribe."""
    return max(1, cores // max(1, builds))


def artifact_configs(host: Sequence[ConfigSpec]) -> list[ConfigSpec]:
    """One configuration per cached artifact (model, engine, precision, input size) among ``host``'s."""
    first: dict[tuple[Any, ...], ConfigSpec] = {}
    for cfg in host:
        if cfg.engine in ARTIFACT_ENGINES:
            key = (cfg.model, cfg.engine, cfg.precision, cfg.resolution, cfg.seq_len, cfg.memory_format)
            first.setdefault(key, cfg)
    return list(first.values())


@dataclass
class Background:
    """Artifact builds running in worker processes; `finish` (or `cancel`) ends them."""

    runners: list[SweepRunner]
    threads: list[threading.Thread]
    log: Callable[[str], None]
    timeout_s: float
    cores_each: int = 0  # each build's threads: its share of the cores (`build_threads`)
    built: list[tuple[ConfigSpec, dict[str, Any]]] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def finish(self) -> None:
        """Wait for every build (at most ``timeout_s`` from the start), stop the workers, log the times."""
        t_wait = time.perf_counter()
        deadline = self.started + self.timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.perf_counter()))
        waited = time.perf_counter() - t_wait
        late = any(t.is_alive() for t in self.threads)
        self.cancel()
        failed = [cfg.model for cfg, info in self.built if "failed" in info]
        each = ", ".join(f"{cfg.model} {_times(info)}" for cfg, info in self.built if "failed" not in info)
        self.log(
            f"host CPU: {len(self.built) - len(failed)} artifact build(s) ({', '.join(ARTIFACT_ENGINES)}, "
            f"{self.cores_each} threads each) beside the prelude, {time.perf_counter() - self.started:.1f} s, "
            f"of it {waited:.1f} s waited"
            + (f" ({each})" if each else "")
            + (f"; not done in {self.timeout_s:.0f} s: measured as before" if late else "")
            + (f"; failed for {', '.join(failed)}: measured as before" if failed else "")
        )

    def cancel(self) -> None:
        """Stop every build worker at once (an interrupted prelude, or after `finish`)."""
        for runner in self.runners:
            runner.close(wait=False)


def prepare_beside(
    host: Sequence[ConfigSpec],
    make_runner: Callable[[], SweepRunner],
    log: Callable[[str], None] = lambda m: None,
    timeout_s: float = 600.0,
    cores: int | None = None,
) -> Background | None:
    """Start building ``host``'s artifacts (`artifact_configs`), or None when it has none.

    ``make_runner``: a CPU `SweepRunner` with the host part's own spec, so that each request (model, seed,
    weights, options) and hence each cache key is the one its measurement will look up.
    """
    todo = artifact_configs(host)
    if not todo:
        return None
    cores = cores or os.cpu_count() or 1
    n = max(1, min(len(todo), cores // CORES_PER_BUILD))
    runners = [make_runner() for _ in range(n)]
    bg = Background(runners, [], log, timeout_s, build_threads(cores, n))

    def build(runner: SweepRunner, cfgs: list[ConfigSpec]) -> None:
        for cfg in cfgs:
            t0 = time.perf_counter()
            try:
                req = runner.request(dataclasses.replace(cfg, threads=bg.cores_each))
                info = dict(runner.call("prepare", req, timeout_s))
                info["build_s"] = time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001 — the measurement builds again and stores any failure
                info = {"failed": f"{type(exc).__name__}: {exc}"[:200]}
            bg.built.append((cfg, info))

    for i, runner in enumerate(runners):
        thread = threading.Thread(target=build, args=(runner, todo[i::n]), daemon=True)
        thread.start()
        bg.threads.append(thread)
    return bg


def _times(info: dict[str, Any]) -> str:
    """One build's seconds for the log: in all, and its export and quantization where it made them."""
    made = [f"{k} {info[f'{k}_s']:.1f}" for k in ("export", "quantize") if f"{k}_s" in info]
    return f"{info.get('build_s', 0.0):.1f} s" + (f" ({', '.join(made)})" if made else "")
