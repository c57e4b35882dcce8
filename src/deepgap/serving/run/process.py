"""The parent side of a serving worker: its requests and replies, and `ServingWorker`, the handle on it.

Why a process: the parent (CLI) never touches the GPU, a crash or hang costs the run only its
status, and tenants — one process each — share a GPU the way separate services do. The worker is the
measurement worker (`deepgap.measure.worker.serve`) answering the ``serve.*`` requests with the handlers
of `deepgap.serving.worker.handlers` (registered here by name; never imported here), so it reuses its model
cache and failure mapping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deepgap.core.records import ConfigSpec
from deepgap.drive.config import SweepSpec
from deepgap.drive.handle import WorkerFailed, WorkerHandle, WorkerLost
from deepgap.drive.inprocess import InProcessWorker
from deepgap.drive.launcher import PreludeMeasure
from deepgap.drive.runner import SweepRunner
from deepgap.measure.protocol import WORKER_MAIN, StatusError, register_worker_module
from deepgap.serving.sim.batcher import BatchPolicy, StopRule
from deepgap.serving.sim.continuous import SlotStop
from deepgap.serving.sim.seqlen import SeqLenDist

DYNAMIC_ENGINES = ("eager",)  # engines whose one prepared instance takes any batch size
CORRECTNESS_ROWS = 4  # ring images checked against the fp32 model on the CPU
ENV_TIMEOUT_S = 120.0  # the worker's fingerprint, asked before the build
CLOSED_LENGTHS = 65_536  # a closed (single-stream) text level's drawn lengths, reused past the end

register_worker_module("deepgap.serving.worker.handlers", "serve.")  # serve.setup, serve.level, serve.loadgen

# What each `ServingWorker` drives: a worker process. CPU tests set `deepgap.drive.inprocess.InProcessWorker`
# here (tests/conftest.py's `inprocess_worker`), the serve's handlers then run in the test's own process.
HANDLE: Callable[[str], WorkerHandle | InProcessWorker] = WorkerHandle


@dataclass(frozen=True)
class SetupRequest:
    """What the worker builds and how it calibrates."""

    model: str
    engine: str
    precision: str
    memory_format: str
    resolution: int
    device: str
    buckets: tuple[int, ...]
    threads: int | None = None
    weights: str | None = None
    seed: int = 0
    pool_size: int = 256
    curve_warmup: int = 10
    curve_iterations: int = 50
    curve_min_time_s: float = 0.0
    # the engine alone's timed window (`server.sustained_s`): 1 s on a GPU, where a short burst boosts
    engine_min_time_s: float = 0.0
    cudnn_benchmark: bool = True
    options: dict[str, Any] = field(default_factory=dict)  # engine options; "dataset": accuracy mode
    # A text model (`deepgap.serving.worker.text_setup`): the padded lengths calibrated (empty: an image
    # model; ``resolution`` is then the longest), the buckets (empty: pad to the batch's longest), and
    # whether batches carry a key padding mask (the distribution has more than one length).
    seq_lens: tuple[int, ...] = ()
    padding_edges: tuple[int, ...] = ()
    masked: bool = False
    packed: bool = False  # ``--padding packed``: batches run with the padding removed (`seqlen.Padding`)
    seq_len_dist: str = ""  # the lengths' distribution as the flag spells it (the levels' record)
    # A decoder (`deepgap.serving.worker.llm_setup`): its cache's positions per slot (0: not a decoder);
    # ``seq_lens`` then holds the prompt lengths whose prefill is calibrated, ``buckets`` the slot counts
    cache_len: int = 0
    # the position every slot holds while the decode step is calibrated (`LlmLoad.decode_position`); 0: half
    # the cache
    decode_position: int = 0
    # and its format, as `ConfigSpec.kv_cache` (``--kv-cache``): None the decoder's own dtype, "fp8" codes
    kv_cache: str | None = None

    def config(self, batch_size: int, include_transfer: bool = False) -> ConfigSpec:
        """The configuration served at ``batch_size`` (the prelude's warm-up, the worker's builds).

        A decoder's cache format enters it (``kv_cache``), so its key and label are never those of the
        decoder's own dtype.
        """
        fields = ("model", "engine", "precision", "device", "memory_format", "threads", "resolution")
        return ConfigSpec(
            batch_size=batch_size,
            include_transfer=include_transfer,
            seq_len=self.resolution if self.seq_lens else None,  # a text model: its longest padded length
            kv_cache=self.kv_cache,
            **{f: getattr(self, f) for f in fields},
        )


@dataclass
class SetupReply:
    """What the worker found: the device, its service curve, correctness, and notes."""

    caps: Any
    env: dict[str, Any]
    buckets: tuple[int, ...]
    curve_samples_s: dict[int, list[float]]
    curve_parts_s: dict[int, dict[str, float]]
    correctness: dict[str, Any]
    engine_info: dict[str, Any]
    setup_s: float = 0.0  # the whole set-up's seconds (`handlers.handle_setup`)
    notes: list[str] = field(default_factory=list)
    peak_mem_reserved_bytes: int | None = None
    accuracy: dict[str, Any] | None = (
        None  # top-1/top-5 on the dataset at the first batch size (accuracy mode)
    )
    # A text model: per calibrated padded length, its curve's samples and parts (``curve_samples_s`` and
    # ``curve_parts_s`` are then the longest length's)
    curves_by_len: dict[int, dict[int, list[float]]] = field(default_factory=dict)
    parts_by_len: dict[int, dict[int, dict[str, float]]] = field(default_factory=dict)


@dataclass(frozen=True)
class LevelRequest:
    """One run: an arrival schedule and a policy (``closed``: single-stream instead)."""

    arrivals_s: np.ndarray | None
    policy: BatchPolicy
    stop: StopRule | SlotStop | None = None
    start_at: float | None = None  # perf_counter instant shared by tenants
    closed: bool = False
    min_queries: int = 0
    min_duration_s: float = 0.0
    max_queries: int = 10**7  # a closed level stops here whatever its minimums (`--max-queries`)
    lengths: np.ndarray | None = None  # a text model: each request's length, in arrival order
    out_lengths: np.ndarray | None = (
        None  # a decoder: each request's output tokens (``lengths``: its prompt's)
    )


class SetupFailed(StatusError):
    """The worker could not build or calibrate, or a level failed: status (oom/skipped/error) and reason."""


class ServingWorker:
    """Parent-side handle of one serving worker: the measurement worker with the ``serve.*`` handlers.

    It is also the serve run's `deepgap.drive.launcher.Launcher` (the first model's, or the first
    tenant's, worker): `start` launches the process for ``model``, `environment` is its fingerprint,
    `prelude` measures the idle baseline and thermal warm-up in it before anything is built (through a
    `deepgap.drive.runner.SweepRunner` on the same process, with the run's ``sweep`` settings). A serve
    whose worker cannot start or answer is still a run — it stores the failed set-up as a level — so
    `start` and `environment` keep that failure in `failure` for the run's body instead of raising.
    """

    def __init__(
        self, device: str, model: str = "", timeout_s: float = 900.0, sweep: SweepSpec | None = None
    ) -> None:
        self.device = device
        self.model = model
        self.timeout_s = timeout_s
        self.sweep = sweep  # the run-level prelude's settings (None: no prelude)
        self.handle = HANDLE(device)
        self.caps: Any = None
        self.env: dict[str, Any] | None = None  # its fingerprint, once `environment` asked
        self.failure: SetupFailed | WorkerLost | None = None  # why `start` or `environment` failed
        # A text model: each level's lengths, `SeqLenDist.draw(n, seed)`, as the simulator draws them
        self.seq_dist: SeqLenDist | None = None
        self.seed = 0

    # The launcher (deepgap.drive.launcher.Launcher)

    def start(self) -> None:
        """Launch the worker for ``model``; a failure is kept in `failure` (the run stores it)."""
        try:
            self.launch(self.model, self.timeout_s)
        except (SetupFailed, WorkerLost) as exc:
            self.failure = exc

    def environment(self) -> dict[str, Any] | None:
        """The worker's fingerprint (the run's, opened before the build); None once it failed."""
        if self.failure is not None:
            return None
        try:
            self.env = self.fingerprint(ENV_TIMEOUT_S)
        except (SetupFailed, WorkerLost) as exc:
            self.failure = exc
        return self.env

    def prelude(self, measure: PreludeMeasure, configs: Sequence[ConfigSpec]) -> None:
        """The idle baseline and thermal warm-up in this worker, before it builds (`serving.run.prelude`)."""
        if self.failure is None and self.sweep is not None:
            measure("", SweepRunner(self.sweep, self.device, worker=self.handle), configs)

    def restart(self) -> None:
        """Stop the process; `setup` launches a fresh one."""
        self.handle.stop()

    def close(self) -> None:
        """Stop the process."""
        self.handle.stop()

    # The serving requests

    def alive(self) -> bool:
        """Whether the process runs."""
        return self.handle.alive()

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not."""
        self.handle.stop()

    def start_serving(
        self, req: SetupRequest, timeout_s: float, say: Callable[[str], None] | None = None
    ) -> SetupReply:
        """Start the process, build and calibrate (progress to ``say``); raises `SetupFailed` or `WorkerLost`."""
        self.launch(req.model, timeout_s)
        return self.setup(req, timeout_s, say)

    def launch(self, model: str, timeout_s: float) -> None:
        """Start the process (it probes the device); raises `SetupFailed` or `WorkerLost`.

        Separate from `setup` so that the run-level prelude (`deepgap.serving.run.prelude`) runs in the
        worker before it builds anything.
        """
        kind, payload = self.handle.spawn(WORKER_MAIN, (self.device,), f"deepgap-serve-{model}", timeout_s)
        if kind != "ready":
            self.handle.stop()
            raise SetupFailed(*payload[:2])
        self.caps = payload

    def fingerprint(self, timeout_s: float) -> dict[str, Any]:
        """The worker's environment fingerprint; raises `SetupFailed` or `WorkerLost`."""
        try:
            return self.handle.call("env", None, timeout_s)
        except WorkerFailed as exc:
            raise SetupFailed(exc.status, exc.reason) from None

    def setup(
        self, req: SetupRequest, timeout_s: float, say: Callable[[str], None] | None = None
    ) -> SetupReply:
        """Build and calibrate in the launched worker (launched again if the prelude lost it).

        ``say``: where the set-up's progress lines go (the serve command's own progress; else stderr).
        """
        if not self.alive():
            self.launch(req.model, timeout_s)
        if say is not None:
            self.handle.on_progress = say
        try:
            reply = self.handle.call("serve.setup", req, timeout_s)
        except WorkerFailed as exc:
            self.handle.stop()
            detail = f"{exc.reason}\n{exc.traceback}" if exc.traceback else exc.reason
            raise SetupFailed(exc.status, detail) from None
        self.caps = reply.caps
        return reply

    def send_level(self, req: LevelRequest) -> None:
        """Send a level without waiting (tenants start together); a text level with its lengths."""
        if self.seq_dist is not None and req.lengths is None:
            n = len(req.arrivals_s) if req.arrivals_s is not None else CLOSED_LENGTHS
            req = dataclasses.replace(req, lengths=self.seq_dist.draw(n, self.seed))
        self.handle.send("serve.level", req)

    def receive_log(self, timeout_s: float):
        """The RequestLog of the level sent last; raises `SetupFailed` for a failure inside it."""
        try:
            return self.handle.receive(timeout_s)
        except WorkerFailed as exc:
            raise SetupFailed(exc.status, exc.reason) from None

    def loadgen(self, req: Any, timeout_s: float) -> Any:
        """Run MLCommons LoadGen against the worker's server; a `loadgen.harness.LoadgenResult`."""
        try:
            return self.handle.call("serve.loadgen", req, timeout_s)
        except WorkerFailed as exc:
            raise SetupFailed(exc.status, exc.reason) from None

    def level(self, req: LevelRequest, timeout_s: float):
        """Run one level and return its RequestLog."""
        self.send_level(req)
        return self.receive_log(timeout_s)
