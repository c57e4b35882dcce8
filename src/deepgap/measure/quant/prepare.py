"""Prepare a quantized ResNet on the GPU: calibrate, time each layer both ways, keep the faster, capture.

Steps of `prepare_quant` (all outside the timed window; their cost is ``Prepared.setup_s``):
  1. fold BatchNorm (fold.py) and calibrate activation ranges on N images (calibrate.py, cached);
  2. per convolution, at the configuration's batch size: run each candidate tile configuration of
     the fused Triton kernel once on a small batch against the exact reference (a failing kernel is
     dropped with its reason), then time the survivors and the fp16 path (cuDNN + fused epilogue)
     inside CUDA graphs (so Python launch overhead does not count);
  3. keep the faster per layer (tiles.choose_modes), rebuild the network with the chosen formats;
  4. capture the whole forward in one CUDA graph per batch size (eager fallback if capture fails).
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from deepgap.measure.quant import layers
from deepgap.measure.quant import tunecache as tune_cache
from deepgap.measure.quant.calibrate import DEFAULT_METHOD, CalibrationKey, calibrate
from deepgap.measure.quant.fold import conv_macs, resnet_graph
from deepgap.measure.quant.network import QuantNet, build
from deepgap.measure.quant.pair_choice import choose_pairs, label_layers, pairs_offered
from deepgap.measure.quant.precompile import precompile
from deepgap.measure.quant.stem_choice import check_stem, choose_head, choose_stem
from deepgap.measure.quant.tiles import choose_modes, gemm_mode
from deepgap.measure.quant.tuning import (  # noqa: F401 (time_s: API)
    CHECK_BATCH,
    _agree,
    _sync,
    time_layer,
    time_s,
    time_stem_and_head,
)
from deepgap.measure.quant.whole_choice import choose_whole
from deepgap.measure.quant.whole_choice import label_layers as label_whole

if TYPE_CHECKING:
    from deepgap.measure.quant.fold import Graph


@dataclass
class QuantOptions:
    """Knobs of `prepare_quant` (defaults are what the engine uses)."""

    calib_images: int = 32
    calib_seed: int = 0
    calib_method: str = DEFAULT_METHOD
    calib_set: Any = None  # a CalibrationSet of real images (accuracy mode); None: synthetic
    use_cache: bool = True  # the calibration and tuning caches (tunecache.py)
    per_layer_choice: bool = True  # time quantized vs fp16 per layer; False = every layer quantized
    autotune: bool = True  # time every candidate tile configuration (else the heuristic one)
    cuda_graph: bool = True
    timing_reps: int = 10
    precompile_workers: int | None = None  # threads compiling tiles first (None: a core each; 0: off)
    margin: float = 0.02
    force_backend: str | None = None  # 'triton' or 'torch' for every quantized layer
    # int8 pixels already in device memory (``--inputs int8-resident``, MLPerf-like): the stem is the
    # int8 stem and the runner takes `QuantResult.make_input`'s tensor, read in place
    resident_input: bool = False
    # programmatic dependent launch: 'off', 'auto' (timed against the plain graph, kept where ≥ 1% faster), 'on'.
    # auto by default since session 55: with each kernel's trigger after its wait (`gdc`, the default since then)
    # batch 1 went 0.272-0.277 → 0.220-0.223 ms on one H100; with the trigger first it had lost (0.291 against
    # 0.253 ms on one H200, session 53), so it was off (docs/quant.md)
    pdl: str = "auto"
    log: Any = None  # callable(str) for progress lines


@dataclass
class QuantResult:
    """A prepared network, what preparing it found, and what `variant` needs to rebuild it differently."""

    net: QuantNet
    run: Any
    info: dict[str, Any] = field(default_factory=dict)
    graph: Any = None
    amax: dict[str, float] = field(default_factory=dict)
    tuned: dict[str, tuple[str, Any]] = field(
        default_factory=dict
    )  # layer → (backend, TileConfig) when quantized
    batch: int = 0
    resolution: int = 0
    device: str = "cuda"
    make_input: Any = None  # resident mode: fp32 images on the device → the runner's int8 input, in place


def variant(
    result: QuantResult,
    modes: dict[str, str] | None = None,
    backend: str | None = None,
    cuda_graph: bool = True,
):
    """A runner for the same calibrated network with other choices, without re-timing (for ablations).

    Args:
        result: a `prepare_quant` result.
        modes: {layer: 'q'|'fp16'}; None = every layer quantized.
        backend: force 'triton' or 'torch' for every layer; None = the tuned backend and tile per layer.
        cuda_graph: capture the forward in a CUDA graph.

    Returns:
        (run, info) as for the prepared network.
    """
    if modes is None:
        modes = {name: ("q" if name in result.tuned or backend else "fp16") for name in result.net.convs}
    net = build(result.graph, result.net.qfmt, result.amax, modes, result.resolution).to(result.device)
    helper = "torch" if backend == "torch" else result.net.stem_backend
    for name, mode in modes.items():
        tuned_backend, cfg = result.tuned.get(name, ("torch", None))
        net.backend[name] = (backend or tuned_backend) if mode == "q" else helper
        net.configs[name] = cfg
    net.stem_backend = helper
    return _make_runner(net, result.batch, result.resolution, result.device, cuda_graph)


def _triton_ok() -> str | None:
    try:
        import triton  # noqa: F401

        from deepgap.measure.quant import kernels  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


def prepare_quant(
    model: torch.nn.Module | Graph,
    precision: str,
    batch: int,
    resolution: int,
    model_name: str,
    device: str = "cuda",
    opts: QuantOptions | None = None,
    weights_sha: str | None = None,
) -> QuantResult:
    """Quantize ``model`` (a torchvision ResNet or its folded `Graph`) and make it runnable at ``batch``."""
    from deepgap.measure.quant.fold import Graph

    opts = opts or QuantOptions()
    gemm = gemm_mode()  # a bad DEEPGAP_QUANT_GEMM stops here, before calibrating
    log = opts.log or (lambda s: None)
    if precision not in layers.QMAX:
        raise ValueError(f"precision must be one of {layers.QFORMATS}; got {precision!r}")
    graph = model if isinstance(model, Graph) else resnet_graph(model.eval())
    if weights_sha is None:
        from deepgap.measure.models.build import weights_fingerprint

        weights_sha = weights_fingerprint(model) if not isinstance(model, Graph) else "graph"
    amax, calibration = _calibrate(graph, model_name, resolution, weights_sha, opts, device)
    info: dict[str, Any] = {"precision": precision, "batch_size": batch, "calibration": calibration}
    info["gemm"] = gemm  # DEEPGAP_QUANT_GEMM: 'persistent' (the persistent TMA tiles were offered) or 'off'
    triton_err = _triton_ok()
    if triton_err:
        info["triton_unavailable"] = triton_err
    _use_device(device)
    net = build(graph, precision, amax, {}, resolution).to(device)
    t1 = time.perf_counter()
    use_triton = triton_err is None and opts.force_backend != "torch"
    cache = tune_cache.TuneCache(tune_cache.device_key(device)) if opts.use_cache and opts.autotune else None
    if opts.precompile_workers != 0:
        info["precompile"] = precompile(net, batch, opts, use_triton, cache, opts.precompile_workers)
    timings = [time_layer(net, name, batch, opts, use_triton, cache) for name in net.convs]
    log(
        f"timed {len(timings)} layers in {time.perf_counter() - t1:.1f}s"
        + (f" (tuning cache: {cache.hits} hits, {cache.misses} tuned)" if cache is not None else "")
    )
    if cache is not None:
        info["tune_cache"] = cache.summary()
    modes = _modes(timings, opts)
    backends, configs = dict(net.backend), dict(net.configs)
    net = build(graph, precision, amax, modes, resolution).to(device)
    for t in timings:
        if t.mode == "q":
            net.backend[t.name], net.configs[t.name] = backends[t.name], configs.get(t.name)
        else:
            net.backend[t.name] = "triton" if use_triton else "torch"
            t.kernel = "cudnn"
    info["pairs"] = _pairs(net, batch, timings, opts, use_triton, device)
    net.stem_backend = check_stem(net, resolution, device) if use_triton else "torch"
    stem_choice = choose_stem(net, batch, resolution, device, use_triton, opts.resident_input)
    stem_s = stem_choice.get("seconds", {}).get(stem_choice["chosen"])  # timed already at this batch
    info.update(
        head=choose_head(net, batch, device, use_triton),  # before the head's row times it
        whole=_whole(net, batch, resolution, device, use_triton, opts, timings),  # after the head's choice
        layers=[t.as_dict() for t in timings],
        outside_layers=time_stem_and_head(net, batch, resolution, device, stem_s, opts.resident_input),
        n_quantized=sum(t.mode == "q" for t in timings),
        n_fp16=sum(t.mode == "fp16" for t in timings),
        n_converts=len(net.converts),
        stem_backend=net.stem_backend,
        stem=stem_choice,
        macs_per_image=int(sum(conv_macs(graph, resolution).values())),
        plan_seconds=round(time.perf_counter() - t1, 3),
    )
    run, graph_info = _make_runner(
        net, batch, resolution, device, opts.cuda_graph, opts.resident_input, opts.pdl
    )
    info.update(graph_info)
    tuned = {t.name: (backends[t.name], configs.get(t.name)) for t in timings if t.q_s is not None}
    res = QuantResult(net, run, info, graph, amax, tuned, batch, resolution, device)
    if opts.resident_input:
        res.make_input, info["input"] = _resident_input(net, run)
    return res


def _pairs(net: QuantNet, batch: int, timings: list, opts: QuantOptions, on: bool, device) -> dict[str, Any]:
    """The fused 1×1 pairs (`pair_choice`): timed and kept where faster on a Hopper-class GPU when offered.

    Returns engine_info's ``pairs``: ``mode`` ('on', 'off': DEEPGAP_QUANT_PAIRS or no Triton, 'no TMA': not a
    CUDA device of compute capability 9.0 or later, 'no autotune') and one row per eligible pair; the kept
    pairs are named in their layers' tile text (`pair_choice.label_layers`).
    """
    if not (on and pairs_offered()):  # DEEPGAP_QUANT_PAIRS: a bad value stops the run before it starts
        return {"mode": "off", "pairs": []}
    if not opts.autotune:
        return {"mode": "no autotune", "pairs": []}
    dev = torch.device(device)
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev) < (9, 0):
        return {"mode": "no TMA", "pairs": []}
    rows = choose_pairs(net, batch, timings, opts.timing_reps)
    label_layers(timings, rows)
    if opts.log:
        opts.log(f"fused 1x1 pairs: {sum(r['kept'] is not None for r in rows)} of {len(rows)} kept")
    return {"mode": "on", "pairs": rows}


def _use_device(device: str) -> None:
    """On a GPU: cuDNN's autotuner on, and ``device`` current (Triton launches on the current device)."""
    if str(device).startswith("cuda"):
        torch.backends.cudnn.benchmark = True
        if ":" in str(device):
            torch.cuda.set_device(device)


def _whole(net: QuantNet, batch: int, resolution: int, device, on: bool, opts: QuantOptions, timings: list):
    """The whole-network kernel (`whole_choice`): timed and kept where faster; its layers' tile text says so.

    Offered with Triton and autotuning only (``on``: Triton here), as the fused pairs are.
    """
    info = choose_whole(net, batch, resolution, device, on and opts.autotune, opts.timing_reps)
    label_whole(timings, net.whole)
    if opts.log and info.get("mode") == "on":
        opts.log(f"whole-network kernel: {'kept, ' + info['kept'] if info['kept'] else 'slower, not kept'}")
    return info


def _modes(timings: list, opts: QuantOptions) -> dict[str, str]:
    """Each layer's mode: chosen by its timings (``per_layer_choice``), else int8 wherever a kernel ran."""
    if opts.per_layer_choice:
        return choose_modes(timings, opts.margin)
    modes = {t.name: ("q" if t.q_s is not None else "fp16") for t in timings}
    for t in timings:
        t.mode = modes[t.name]
    return modes


def _resident_input(net: QuantNet, run: Any):
    """(make_input, its info): fp32 images → int8 pixels in the runner's own input buffer (no copy on replay)."""

    def make(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            q = net.stem.quantize(x, net.stem_backend)
            static = getattr(run, "static_in", None)
            if static is None or tuple(static.shape) != tuple(q.shape):
                return q
            static.copy_(q)
            return static

    return make, {"mode": "int8-resident", "layout": net.stem.input_layout, "scale": net.stem.in_scale}


def _calibrate(
    graph: Graph, model_name: str, resolution: int, weights_sha: str, opts: QuantOptions, device: str
) -> tuple[dict[str, float], dict[str, Any]]:
    """Activation ranges of ``graph`` (cached by model, weights and calibration set) and where they came from."""
    log = opts.log or (lambda s: None)
    t0 = time.perf_counter()
    cs = opts.calib_set
    key = CalibrationKey(
        model_name,
        resolution,
        weights_sha,
        opts.calib_images if cs is None else int(cs.images.shape[0]),
        opts.calib_seed,
        opts.calib_method,
        "synthetic" if cs is None else cs.fingerprint,
    )
    amax, cached = calibrate(graph, key, device, opts.use_cache, None if cs is None else cs.images)
    calibration = {
        "images": key.n_images,
        "seed": key.seed,
        "method": key.method,
        "from_cache": cached,
        "source": "synthetic N(0,1) images (no dataset)" if cs is None else dict(cs.info),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    log(f"calibrated ({'cache' if cached else f'{time.perf_counter() - t0:.1f}s'})")
    return amax, calibration


def _make_runner(
    net: QuantNet,
    batch: int,
    resolution: int,
    device: str,
    use_graph: bool,
    resident: bool = False,
    pdl: str = "off",
):
    """``run(x)`` for the network: a CUDA graph replay when capture works, else the eager forward.

    The graph runner owns ``net``: the graph reads its weights by address (see `GraphRunner`).
    ``resident``: the graph's input is int8 pixels (`quant.stem_int8`), not an fp16 batch. ``pdl``: capture
    with programmatic dependent launch too and keep the faster graph (`quant.pdl_choice`); then the shortcut
    convolutions on a second stream, where ``DEEPGAP_QUANT_BRANCH`` asks (`quant.branch_choice`).
    """
    from deepgap.measure import graph_runner

    static_x = torch.randn(batch, 3, resolution, resolution, device=device).half()
    static_x = static_x.contiguous(memory_format=torch.channels_last)
    if resident:
        static_x = net.stem.quantize(static_x, net.stem_backend)
    with torch.inference_mode():
        net.forward(static_x)
    _sync(device)
    if not use_graph or not graph_runner.can_capture(device):
        return net.forward, {"cuda_graph": False}
    try:
        graph, static_out = graph_runner.capture(net.forward, static_x, device, warmup=2)
    except Exception as exc:  # noqa: BLE001 - eager still works
        _sync(device)
        return net.forward, {
            "cuda_graph": False,
            "cuda_graph_error": f"{type(exc).__name__}: {exc}"[:500],
            "cuda_graph_traceback": traceback.format_exc()[-2000:],
        }
    from deepgap.measure.quant import branch_choice, repeats
    from deepgap.measure.quant.pdl_choice import choose_pdl

    runner = plain_runner = graph_runner.GraphRunner(graph, static_x, static_out, owns=net)
    plain = repeats.check(runner, static_x)  # the choices below compare graphs by their bits
    if not plain["same"]:  # nothing to compare against: the engine's faults fail the configuration
        return runner, {"cuda_graph": True, "repeatable": {"plain": plain}}
    runner, pdl_info = choose_pdl(net, runner, static_x, device, pdl)
    pdl_kept = bool(pdl_info and pdl_info.get("chosen"))
    # then the shortcut convolutions on a second stream (DEEPGAP_QUANT_BRANCH), under the launch mode kept
    runner, branch_info = branch_choice.choose(net, runner, static_x, device, pdl_kept)
    # a graph a choice kept: one equal replay against the plain one proved no more (the plain one is checked)
    kept = {"plain": plain, "kept": plain if runner is plain_runner else repeats.check(runner, static_x)}
    info = {"pdl": pdl_info, "branch": branch_info, "repeatable": kept}
    return runner, {"cuda_graph": True, **{k: v for k, v in info.items() if v is not None}}
