"""Prepare a quantized ResNet on the GPU: calibrate, time each layer both ways, keep the faster, capture.

Steps of `prepare_quant` (all outside the timed window; their cost is ``Prepared.setup_s``):
  1. fold BatchNorm (fold.py) and calibrate activation ranges on N images (calibrate.py, cached);
  2. per convolution, at the configuration's batch size: run each candidate tile configuration of
     the fused Triton kernel once on a small batch against the exact reference (a failing kernel is
     dropped with its reason), then time the survivors and the fp16 path (cuDNN + fused epilogue)
     inside CUDA graphs (so Python launch overhead does not count);
  3. keep the faster per layer (plan.choose_modes), rebuild the network with the chosen formats;
  4. capture the whole forward in one CUDA graph per batch size (eager fallback if capture fails).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from deepgap.quant import layers
from deepgap.quant.calibrate import DEFAULT_METHOD, CalibrationKey, calibrate
from deepgap.quant.fold import conv_macs, resnet_graph
from deepgap.quant.network import QuantNet, build, fp16_conv
from deepgap.quant.plan import LayerTiming, candidate_configs, choose_modes

if TYPE_CHECKING:
    from deepgap.quant.fold import Graph

CHECK_BATCH = 2  # images in each kernel's self-check against the exact reference


@dataclass
class QuantOptions:
    """Knobs of `prepare_quant` (defaults are what the engine uses)."""

    calib_images: int = 32
    calib_seed: int = 0
    calib_method: str = DEFAULT_METHOD
    calib_set: Any = None  # a deepgap.calibration.CalibrationSet of real images (accuracy mode); None: synthetic
    use_cache: bool = True
    per_layer_choice: bool = True  # time quantized vs fp16 per layer; False = every layer quantized
    autotune: bool = True  # time every candidate tile configuration (else the heuristic one)
    cuda_graph: bool = True
    timing_reps: int = 10
    margin: float = 0.02
    force_backend: str | None = None  # 'triton' or 'torch' for every quantized layer
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


def time_s(fn, reps: int = 10, device: str = "cuda", use_graph: bool = True) -> float:
    """Median seconds of ``fn()``; on CUDA replays a graph of ``reps`` calls when capture works.

    Graph replay removes the Python launch overhead, which at small batches is larger than the kernel.
    On the CPU (tests, Triton interpreter) it is a plain ``perf_counter`` median.
    """
    if not str(device).startswith("cuda"):
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if use_graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(reps):
                    fn()
            g.replay()
            times = []
            for _ in range(3):
                start.record()
                g.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3 / reps)
            del g
            return statistics.median(times)
        except Exception:  # noqa: BLE001 - fall back to launch-by-launch timing
            torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def _rand_act(m: int, c: int, fmt: str, device) -> torch.Tensor:
    """Random, never-zero-heavy activations in a storage format (int8 in ±100, fp8/fp16 normal·40)."""
    if fmt == "int8":
        return torch.randint(-100, 101, (m, c), dtype=torch.int8, device=device)
    return (torch.randn(m, c, device=device) * 40).to(layers.DTYPES[fmt])


def _agree(out: torch.Tensor, ref: torch.Tensor, fmt: str) -> str | None:
    """None when a kernel's output matches the exact reference, else a one-line reason."""
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return f"shape/dtype {tuple(out.shape)} {out.dtype} != {tuple(ref.shape)} {ref.dtype}"
    o, r = out.float(), ref.float()
    if not torch.isfinite(o).all():
        return "non-finite output"
    if fmt == "int8":
        d = (o - r).abs()
        if d.max() > 1 or (d > 0).float().mean() > 1e-3:
            frac = float((d > 0).float().mean())
            return f"int8 mismatch: max |Δ| {float(d.max()):.0f}, {frac:.2%} of elements"
        return None
    rel = float((o - r).norm() / r.norm().clamp_min(1e-12))
    bound = 0.03 if fmt == "fp8" else 5e-3  # fp16 out: fp8 tensor cores accumulate imprecisely
    return None if rel <= bound else f"{fmt} mismatch: relative error {rel:.3g} > {bound}"


def _time_layer(net: QuantNet, name: str, batch: int, opts: QuantOptions, backend_ok: bool) -> LayerTiming:
    """Self-check and time one convolution's quantized candidates and its fp16 path."""
    layer = net.convs[name]
    n = layer.node
    h, w, _ = net.shapes[n.inp]
    oh, ow, _ = net.shapes[n.out]
    dev = layer.w_q.device
    t = LayerTiming(name=name, macs=batch * oh * ow * n.cout * n.cin * n.kernel_size**2)
    x = _rand_act(batch * h * w, n.cin, layer.in_fmt, dev)
    res = _rand_act(batch * oh * ow, n.cout, layer.res_fmt, dev) if n.residual else None
    cb = min(CHECK_BATCH, batch)
    xs = x[: cb * h * w]
    rs = res[: cb * oh * ow] if res is not None else None
    ref = layers.conv_reference(layer, xs, (cb, h, w), rs)
    errors: list[str] = []
    best: tuple[float, str, Any] | None = None
    cands: list[tuple[str, Any]] = []
    if backend_ok and opts.force_backend != "torch":
        cfgs = candidate_configs(batch * oh * ow, n.cout, n.cin, net.qfmt, n.residual is not None)
        cands += [("triton", c) for c in (cfgs if opts.autotune else cfgs[:1])]
    if opts.force_backend != "triton":
        cands.append(("torch", None))
    for backend, cfg in cands:
        if backend == "torch" and best is not None:
            break  # the torch path is a fallback, not a contender
        net.backend[name], net.configs[name] = backend, cfg
        try:
            why = _agree(net.run_conv(name, xs, cb, rs), ref, layer.out_fmt)
            if why is None:
                sec = time_s(lambda: net.run_conv(name, x, batch, res), opts.timing_reps, str(dev))
                if best is None or sec < best[0]:
                    best = (sec, backend, cfg)
            else:
                errors.append(f"{backend} {cfg.label if cfg else ''}: {why}")
        except Exception as exc:  # noqa: BLE001 - a failing kernel is reported and skipped
            errors.append(
                f"{backend} {cfg.label if cfg else ''}: {type(exc).__name__}: {_first_line(exc)}"
            )
            _sync(dev)
    if best is not None:
        t.q_s, t.kernel, t.config = best[0], best[1], best[2].label if best[2] else None
        net.backend[name], net.configs[name] = best[1], best[2]
    if errors:
        t.q_error = "; ".join(errors)[:1000]
    if opts.per_layer_choice or best is None:
        xh = _rand_act(batch * h * w, n.cin, "fp16", dev)

        def fp16_path():
            acc = fp16_conv(xh, (batch, h, w), layer.w_half, n.stride, n.padding)
            if backend_ok:
                return _epi(acc, layer, res)
            return layers.epilogue_reference(
                acc.float(), layer.alpha, layer.beta, layer.out_fmt, n.relu, res, layer.gamma
            )

        try:
            t.fp16_s = time_s(fp16_path, opts.timing_reps, str(dev))
        except Exception as exc:  # noqa: BLE001
            t.q_error = ((t.q_error or "") + f"; fp16: {type(exc).__name__}: {exc}")[:1000]
    return t


def _first_line(exc: BaseException) -> str:
    return (str(exc) or "?").splitlines()[0][:200]


def _sync(device) -> None:
    """Synchronize after a failed launch; a sticky CUDA error then surfaces at the next real call."""
    if str(device).startswith("cuda"):
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()


def _epi(acc, layer, res):
    from deepgap.quant import kernels

    return kernels.epilogue(acc, layer.alpha, layer.beta, layer.out_fmt, layer.node.relu, res, layer.gamma)


def _triton_ok() -> str | None:
    try:
        import triton  # noqa: F401

        from deepgap.quant import kernels  # noqa: F401
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
    from deepgap.quant.fold import Graph

    opts = opts or QuantOptions()
    log = opts.log or (lambda s: None)
    if precision not in layers.QMAX:
        raise ValueError(f"precision must be one of {layers.QFORMATS}; got {precision!r}")
    graph = model if isinstance(model, Graph) else resnet_graph(model.eval())
    if weights_sha is None:
        from deepgap.models import weights_fingerprint

        weights_sha = weights_fingerprint(model) if not isinstance(model, Graph) else "graph"
    t0 = time.perf_counter()
    cs = opts.calib_set
    key = CalibrationKey(
        model_name, resolution, weights_sha, opts.calib_images if cs is None else int(cs.images.shape[0]),
        opts.calib_seed, opts.calib_method, "synthetic" if cs is None else cs.fingerprint,
    )
    amax, cached = calibrate(graph, key, device, opts.use_cache, None if cs is None else cs.images)
    info: dict[str, Any] = {
        "precision": precision,
        "batch_size": batch,
        "calibration": {
            "images": key.n_images,
            "seed": key.seed,
            "method": key.method,
            "from_cache": cached,
            "source": "synthetic N(0,1) images (no dataset)" if cs is None else dict(cs.info),
            "seconds": round(time.perf_counter() - t0, 3),
        },
    }
    log(f"calibrated ({'cache' if cached else f'{time.perf_counter() - t0:.1f}s'})")
    triton_err = _triton_ok()
    if triton_err:
        info["triton_unavailable"] = triton_err
    if str(device).startswith("cuda"):
        torch.backends.cudnn.benchmark = True
        if ":" in str(device):
            torch.cuda.set_device(device)  # Triton launches on the current device
    net = build(graph, precision, amax, {}, resolution).to(device)
    t1 = time.perf_counter()
    use_triton = triton_err is None and opts.force_backend != "torch"
    timings = [_time_layer(net, name, batch, opts, use_triton) for name in net.convs]
    log(f"timed {len(timings)} layers in {time.perf_counter() - t1:.1f}s")
    if opts.per_layer_choice:
        modes = choose_modes(timings, opts.margin)
    else:
        modes = {t.name: ("q" if t.q_s is not None else "fp16") for t in timings}
        for t in timings:
            t.mode = modes[t.name]
    backends, configs = dict(net.backend), dict(net.configs)
    net = build(graph, precision, amax, modes, resolution).to(device)
    for t in timings:
        if t.mode == "q":
            net.backend[t.name], net.configs[t.name] = backends[t.name], configs.get(t.name)
        else:
            net.backend[t.name] = "triton" if use_triton else "torch"
            t.kernel = "cudnn"
    net.stem_backend = _check_stem(net, resolution, device) if use_triton else "torch"
    macs = conv_macs(graph, resolution)
    info.update(
        layers=[t.as_dict() for t in timings],
        n_quantized=sum(t.mode == "q" for t in timings),
        n_fp16=sum(t.mode == "fp16" for t in timings),
        n_converts=len(net.converts),
        stem_backend=net.stem_backend,
        macs_per_image=int(sum(macs.values())),
        plan_seconds=round(time.perf_counter() - t1, 3),
    )
    run, graph_info = _make_runner(net, batch, resolution, device, opts.cuda_graph)
    info.update(graph_info)
    tuned = {t.name: (backends[t.name], configs.get(t.name)) for t in timings if t.q_s is not None}
    return QuantResult(net, run, info, graph, amax, tuned, batch, resolution, device)


def _check_stem(net: QuantNet, resolution: int, device: str) -> str:
    """'triton' when the fused max-pool kernel (and format conversion) match the torch path, else 'torch'."""
    x = torch.randn(CHECK_BATCH, 3, resolution, resolution, device=device).half()
    try:
        why = _agree(net.run_stem(x, "triton"), net.run_stem(x, "torch"), net.stem.out_fmt)
    except Exception as exc:  # noqa: BLE001
        why = f"{type(exc).__name__}: {exc}"
    _sync(device)
    return "triton" if why is None else "torch"


def _make_runner(net: QuantNet, batch: int, resolution: int, device: str, use_graph: bool):
    """``run(x)`` for the network: a CUDA graph replay when capture works, else the eager forward.

    The graph runner owns ``net``: the graph reads its weights by address (see `GraphRunner`).
    """
    from deepgap.engines import graph_runner

    static_x = torch.randn(batch, 3, resolution, resolution, device=device).half()
    static_x = static_x.contiguous(memory_format=torch.channels_last)
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
    return graph_runner.GraphRunner(graph, static_x, static_out, owns=net), {"cuda_graph": True}
