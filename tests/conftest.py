"""Shared fixtures: tiny sweeps that run in seconds on a 2-core CPU."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from pathlib import Path

# Python writes its bytecode cache for the suite's processes, whatever the environment says. CI's container
# sets PYTHONDONTWRITEBYTECODE=1, and uv installs no .pyc, so every process (each xdist worker, fork server,
# worker, CLI subprocess and Ray process) compiled torch's and deepgap's sources again on import: `import
# torch, torchvision` took 16.5 CPU-s that way against 7.3 with a cache. Set here, before the xdist workers
# start, it reaches every process the suite spawns; the cache goes to __pycache__/ (gitignored), not to the
# tree's tracked files.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# One OpenMP thread per process, and waiting threads that sleep, unless the environment says otherwise.
# Why: a full run puts three xdist workers (and the worker processes they start) on two cores, and torch's
# OpenMP threads spin-wait for their team between parallel regions, burning the cores that the other
# processes wait for. Two copies of test_quant_engine + test_quant_tunecache side by side took 109 and 136
# CPU-s (70 and 119 s of wall time) with torch's default two spinning threads, 45 CPU-s (25-39 s) with one
# thread, 47 (41 s) with two passive ones. Set here, before anything imports torch, both reach every
# process the suite starts (xdist workers, fork servers, workers, CLI subprocesses). A measurement still
# runs at the thread count its spec names (`torch.set_num_threads`), ONNX Runtime follows torch's count
# (`measure/engines/ort.py`), and Inductor's C++ kernels are compiled for it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

from deepgap.drive.config import SweepSpec  # noqa: E402

TINY = dict(
    models=("tinycnn",),
    engines=("eager",),
    precisions=("fp32",),
    batch_sizes=(1, 2),
    device="cpu",
    warmup=1,
    iterations=3,
    repeats=2,
    threads=(1,),
    max_time_s=5.0,
    timeout_s=120.0,
)


@pytest.fixture
def tiny_spec() -> SweepSpec:
    """A sweep of two configurations of the tiny CNN on one CPU thread."""
    return SweepSpec(**TINY)


@pytest.fixture(scope="module")
def r50_net():
    """ResNet-50 folded and quantized (int8) at 32², calibrated on one image: layer1 at 8×8 (64 rows an image).

    For the quant kernels' tests through a real network (tests/measure/quant/). Module-scoped: each test file
    gets its own network, which its tests may retune (``configs``, ``backend``).
    """
    import torch
    from torchvision import models

    from deepgap.measure.quant.calibrate import calibration_images, collect_amax
    from deepgap.measure.quant.fold import resnet_graph
    from deepgap.measure.quant.network import build

    torch.manual_seed(0)
    graph = resnet_graph(models.resnet50().eval())
    return build(graph, "int8", collect_amax(graph, calibration_images(1, 32, 0), method="max"), {}, 32)


def stem_case(h: int, w: int, seed: int = 0):
    """Two random images (h×w), ResNet stem weights [64, 3, 7, 7] and epilogue α, β: the int8 stems' tests."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, h, w, generator=g)
    weight = torch.randn(64, 3, 7, 7, generator=g, dtype=torch.float64) * 0.2
    alpha = torch.rand(64, generator=g) * 0.01 + 0.001
    beta = torch.randn(64, generator=g)
    return x, weight, alpha, beta


def with_sizes_in_turn(first, second, sizes=((32, 32), (30, 34))):
    """Every pair of ``first`` and ``second``, each with one of two image ``sizes`` in turn: ``(a, b, size)``.

    Why: the stems' interpreter tests cost 0.5-3 CPU-s a case; this keeps every pair of any two of the three
    factors (a with b, a with each size, b with each size) at half the cases of the full product.
    """
    return [(a, b, sizes[(i + j) % 2]) for i, a in enumerate(first) for j, b in enumerate(second)]


def case_id(value) -> str:
    """A test id for one value of `with_sizes_in_turn`'s cases: ``32x32`` for a size, else the value."""
    return "x".join(map(str, value)) if isinstance(value, tuple) else str(value)


@pytest.fixture
def inprocess_runs(monkeypatch):
    """`deepgap.run` (and the CLI's run) measure in this process (`deepgap.drive.inprocess.InProcessWorker`).

    For tests whose point is what is measured and stored, not the worker's isolation (tests/drive/test_runner.py,
    test_resume.py and the fleet tests keep real processes): a worker process first imports torch and
    torchvision in a fork server (10-20 s of CPU on two cores). The thread count a measurement sets is put back.
    """
    with inprocess_worker(monkeypatch):
        yield


@contextlib.contextmanager
def inprocess_worker(mp: pytest.MonkeyPatch):
    """What `inprocess_runs` does, for a module-scoped fixture (``with pytest.MonkeyPatch.context() as mp``)."""
    import torch

    import deepgap.drive.sweep
    from deepgap.drive.inprocess import InProcessWorker
    from deepgap.drive.runner import SweepRunner

    def in_process(spec, device):
        return SweepRunner(spec, device, worker=InProcessWorker(device))

    threads = torch.get_num_threads()
    mp.setattr(deepgap.drive.sweep, "SweepRunner", in_process)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def inprocess_serving(mp: pytest.MonkeyPatch) -> None:
    """``serve``'s workers too run in this process (`deepgap.serving.run.process.HANDLE`), for CPU tests of
    what a serve does with its input and stores (tests/whole/test_fuzz_deep.py); tests/serving/ keeps real processes."""
    import deepgap.serving.run.process
    from deepgap.drive.inprocess import InProcessWorker

    mp.setattr(deepgap.serving.run.process, "HANDLE", InProcessWorker)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's garbage collections walk only the objects made since it started (`gc.freeze`).

    Why: a full collection walks every object in the process, and a test process holds torch, Dynamo,
    pandas, matplotlib and every collected test module (millions of objects): each one took ~0.65 s.
    The in-process measurements call ``gc.collect()`` after every configuration
    (`deepgap.measure.configuration._release`), as a worker process does over its own, far smaller
    heap, and pandas/matplotlib trigger full collections of their own: in test_engines + test_report +
    test_two_gpus (~90 CPU-s) the collector took 27 CPU-s, 3.5 with this and `_freeze_before_each_request`
    (test_engines alone: 20.4 CPU-s -> 8.1). What existed
    before the test is not its garbage; it goes back to the collector when the test ends
    (`gc.unfreeze`), so nothing leaks past a test.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _freeze_before_each_request() -> None:
    """`InProcessWorker` handles each request over a heap frozen at its start (see `pytest_runtest_protocol`).

    A worker process's ``gc.collect()`` after a configuration walks the worker's own objects; in this
    process it also walked what the test made before (a first torch.compile imports much of Inductor),
    once per configuration. Frozen objects are unfrozen when the test ends.
    """
    from deepgap.drive.inprocess import InProcessWorker

    send = InProcessWorker.send

    def frozen_send(self, kind, payload):
        gc.freeze()
        return send(self, kind, payload)

    InProcessWorker.send = frozen_send


_freeze_before_each_request()

FULL_RUN_WORKERS = 3


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """A full run (``python -m pytest -q``: no paths, no ``-n``) uses three xdist workers, one file each.

    Why three on two cores: a test that waits on a real process, a socket or a timeout leaves a core to the
    others, but each worker also costs its own collection (~13 CPU-s: torch, Dynamo, scipy, pandas), fork
    server (~7 CPU-s) and first imports. In session 15 (more waiting tests) four took pytest 458 s against
    481 s for three; since then the waits went in-process, and the suite is CPU-bound: clean clones of one
    tree (2026-12-03), four workers 711 CPU-s of process tree and 421 s, three 589 CPU-s and 317 s (the
    host's other load was higher during the first; collection alone costs ~13 CPU-s a worker at any load).
    ``--dist loadfile`` keeps each file (and its module fixtures, the Ray cluster, the served store) in one
    worker. ``pytest tests/store/test_x.py``, ``-n 0``, ``--pdb``, ``--co`` or
    ``DEEPGAP_TEST_SERIAL=1`` stay serial; without pytest-xdist installed this does nothing. Runs before
    xdist's own hook (conftests register after plugins, and same-priority hooks run newest first).
    """
    opt = config.option
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or os.environ.get("DEEPGAP_TEST_SERIAL"):
        return
    if opt.numprocesses is not None or opt.dist != "no" or opt.tx or opt.collectonly or opt.usepdb:
        return
    opt.numprocesses = FULL_RUN_WORKERS
    opt.dist = "loadfile"
    opt.loadscopereorder = False  # files in collection order: the slow files first (see below)


def pytest_sessionstart(session):
    """Under xdist, the controller prepares the caches that every worker reads, before the workers start.

    Why: the workers start at the same moment and each imports every test file and what it imports at
    collection; on a clean clone nothing is cached yet, so each did the same compiling at once
    (`_rewrite_test_files`, `_compile_what_collection_imports`).
    """
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    if sys.dont_write_bytecode:
        return
    _rewrite_test_files(config)
    _compile_what_collection_imports(config)


def _rewrite_test_files(config) -> None:
    """The test files' assert-rewritten code, written once to ``__pycache__`` (~5 CPU-s a worker before).

    Uses pytest's own rewriting functions (private API): if they change, this does nothing and the workers
    rewrite as before.
    """
    try:
        from _pytest.assertion.rewrite import PYC_TAIL, _read_pyc, _rewrite_test, _write_pyc, assertstate_key
    except ImportError:  # pragma: no cover - another pytest
        return
    if config.getoption("assertmode") != "rewrite":
        return
    state = config.stash[assertstate_key]
    here = Path(__file__).parent
    tests = sorted(here.rglob("test_*.py"))  # tests/<package>/…, as deep as they go
    for fn in [here / "conftest.py", *tests]:
        pyc = fn.parent / "__pycache__" / (fn.stem + PYC_TAIL)
        try:
            if _read_pyc(fn, pyc) is None:
                pyc.parent.mkdir(exist_ok=True)
                source_hash, co = _rewrite_test(fn, config)
                _write_pyc(state, co, source_hash, pyc)
        except Exception:  # noqa: BLE001 - a cache warm-up; the workers rewrite whatever is missing
            return


# What every xdist worker imports at collection, in two halves of similar cost on a fresh venv (CPU-s: torch
# 7.5, then Dynamo and torchvision 13; scipy.stats 4.3, pandas 2.8, deepgap's own sources 1, pytest and its
# plugins, whose bytecode the controller did not write: CI sets PYTHONDONTWRITEBYTECODE, read before
# this file clears it): compiled by two processes side by side, one per core, before the workers start
# (`_compile_what_collection_imports`). Whole packages where collection imports most of their modules.
COLLECTION_IMPORTS = (
    "import torch._dynamo, torchvision, torchvision.transforms",
    "import scipy.stats, pandas, pyarrow; import compileall, importlib.util, sys\n"
    "for name in ('_pytest', 'pluggy', 'execnet', 'xdist', 'anyio', 'hypothesis', 'rich'):\n"
    "    spec = importlib.util.find_spec(name)\n"
    "    if spec and spec.submodule_search_locations:\n"
    "        compileall.compile_dir(spec.submodule_search_locations[0], quiet=1)\n"
    "compileall.compile_dir(sys.argv[1], quiet=1)",
)


def _compile_what_collection_imports(config) -> None:
    """On a fresh venv, write the bytecode of what collection imports once, before the workers start.

    Why: uv installs no ``.pyc`` and a clean clone has none of deepgap's, so each xdist worker compiled
    torch's, scipy's, pandas' and deepgap's sources while collecting, all of them at once (a
    collection-only ``-n 4`` run on a fresh venv: 102-124 CPU-s, against 46 on a warm one). Two processes
    (`COLLECTION_IMPORTS`) compile them first; the workers, and the fork servers after them, read the
    cache (that run: 124 -> 80 CPU-s, 78 -> 64 s). One ``pytest --co`` in their place saved less (87
    CPU-s) and kept one core idle for 40 s, longer than the workers' whole collection before.
    Skipped when torch's cache exists: any earlier run wrote it.
    """
    import importlib.util
    import subprocess

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin or os.path.exists(importlib.util.cache_from_source(spec.origin)):
        return
    src = str(Path(__file__).resolve().parent.parent / "src" / "deepgap")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, src], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for code in COLLECTION_IMPORTS
    ]
    for p in procs:  # a failed import fails again, and is reported, in the workers' own collection
        try:
            p.wait(600)
        except subprocess.TimeoutExpired:
            p.kill()


# The files that take longest in a full run on the 2-core CI host, longest first: the Ray cluster, real worker
# processes and serving (mostly waiting), then the heaviest CPU work (Chromium and report builds, Inductor,
# the harness script's arms). Measured 2026-12-03 per file, alone, as CPU-s of its whole process tree:
# fleet_ray 48, report_layout 48, engines 33, harness_overhead 31 (86 s of wall), report_travels 31,
# roofline_cli 29, two_gpus 27, signals 25, serving_cli 25, runner 22, resume 22, session 21,
# behaviour_unchanged 21, report 20, quant_kernels 18, serving_loadgen 18, accuracy_mode 18,
# fleet_ray_prelude 17, flop_counter 16; the other files 14 CPU-s or less. test_runner leads: it is the
# first file of its xdist worker, whose fork server is then the one its CUDA check starts (it stops a server
# that an earlier file started: `-n 0` test_session then test_runner 25.9/25.9 CPU-s, the other way round
# 19.7/21.3).
LONGEST_FIRST = (
    "test_runner.py",
    "test_fleet_ray.py",
    "test_serving_cli.py",
    "test_report_layout.py",
    "test_harness_overhead.py",
    "test_engines.py",
    "test_report_travels.py",
    "test_roofline_cli.py",
    "test_two_gpus.py",
    "test_signals.py",
    "test_resume.py",
    "test_session.py",
    "test_behaviour_unchanged.py",
    "test_report.py",
    "test_quant_kernels.py",
    "test_serving_loadgen.py",
    "test_accuracy_mode.py",
    "test_fleet_ray_prelude.py",
    "test_flop_counter.py",
)


LONGEST_FIRST_ENV = "DEEPGAP_TEST_LONGEST_FIRST"


def pytest_configure(config):
    """The xdist controller of a ``--dist loadfile`` run tells its workers to order the files (`LONGEST_FIRST`).

    Why through the environment: a worker cannot see the run's ``--dist``; xdist sets the worker's own
    ``config.option.dist`` to ``"no"`` before it collects, so the order below, keyed on that option until
    2026-12-03, never took effect. The workers inherit the controller's environment when they start (after
    this hook).
    """
    if not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") == "loadfile":
        os.environ[LONGEST_FIRST_ENV] = "1"


def pytest_collection_modifyitems(config, items):
    """Skip @pytest.mark.gpu tests unless CUDA is usable; under xdist, hand out the longest files first.

    Why the order: a worker takes the next whole file when it is nearly done with one, so a long file
    handed out last leaves the other workers idle at the end: longest first (`LONGEST_FIRST`), then the
    other files marked slow, then the rest in collection order. Before, only slow-marked files went first,
    and the report builds (test_report_layout, test_report_travels, test_roofline_cli, test_two_gpus: 27-48
    CPU-s each, late in the alphabet) were handed out among the last. Files keep their own test order
    (module fixtures and the Ray tests depend on it).
    """
    if hasattr(config, "workerinput") and os.environ.get(LONGEST_FIRST_ENV) == "1":
        slow = {item.path for item in items if item.get_closest_marker("slow")}
        first = {name: i for i, name in enumerate(LONGEST_FIRST)}
        # stable: files stay whole and in order
        items.sort(key=lambda item: (first.get(item.path.name, len(first)), item.path not in slow))
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run through the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
