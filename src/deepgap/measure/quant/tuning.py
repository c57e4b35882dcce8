"""Per-layer tuning of the quant engine: self-check each candidate kernel, time it, keep the fastest.

Why its own module: `prepare.prepare_quant` is the recipe (calibrate, tune, choose, capture); this is
the measuring inside step 2 of it: exact self-checks against the float reference, CUDA-graph timing of each
candidate, the fp16 path's time, the memory floor of each layer, and the tuning cache (`tunecache.py`).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from typing import Any

import torch

from deepgap.measure.quant import kernels, layers, split_k
from deepgap.measure.quant import tunecache as tune_cache
from deepgap.measure.quant.network import QuantNet, fp16_conv
from deepgap.measure.quant.repeats import at_batch_on_gpu
from deepgap.measure.quant.tiles import (
    LayerTiming,
    candidate_configs,
    persistent_configs,
    small_batch_offered,
)
from deepgap.measure.timing import HostClock

CHECK_BATCH = 2  # images in each kernel's self-check against the exact reference


def time_s(fn, reps: int = 10, device: str = "cuda", use_graph: bool = True) -> float:
    """Median seconds of ``fn()``; on CUDA replays a graph of ``reps`` calls when capture works.

    Graph replay removes the Python launch overhead, which at small batches is larger than the kernel.
    On the CPU (tests, Triton interpreter) it is a plain ``perf_counter`` median.
    """
    if not str(device).startswith("cuda"):
        fn()
        clock = HostClock()
        return statistics.median([clock.time_iteration(fn) for _ in range(reps)])
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


def rand_act(m: int, c: int, fmt: str, device) -> torch.Tensor:
    """Random, never-zero-heavy activations in a storage format (int8 in ±100, fp8/fp16 normal·40)."""
    if fmt == "int8":
        return torch.randint(-100, 101, (m, c), dtype=torch.int8, device=device)
    return (torch.randn(m, c, device=device) * 40).to(layers.DTYPES[fmt])


def _agree(out: torch.Tensor, ref: torch.Tensor, fmt: str, max_frac: float = 1e-3) -> str | None:
    """None when a kernel's output matches the exact reference, else a one-line reason.

    int8: off by at most one step, in at most ``max_frac`` of the elements.
    """
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return f"shape/dtype {tuple(out.shape)} {out.dtype} != {tuple(ref.shape)} {ref.dtype}"
    o, r = out.float(), ref.float()
    if not torch.isfinite(o).all():
        return "non-finite output"
    if fmt == "int8":
        d = (o - r).abs()
        if d.max() > 1 or (d > 0).float().mean() > max_frac:
            frac = float((d > 0).float().mean())
            return f"int8 mismatch: max |Δ| {float(d.max()):.0f}, {frac:.2%} of elements"
        return None
    rel = float((o - r).norm() / r.norm().clamp_min(1e-12))
    bound = 0.03 if fmt == "fp8" else 5e-3  # fp16 out: fp8 tensor cores accumulate imprecisely
    return None if rel <= bound else f"{fmt} mismatch: relative error {rel:.3g} > {bound}"


ITEM_BYTES = {"int8": 1, "fp8": 1, "fp16": 2}


def layer_shape(net: QuantNet, name: str, batch: int) -> tune_cache.LayerShape:
    """The tuning cache's key for one convolution at ``batch``."""
    layer = net.convs[name]
    n = layer.node
    oh, ow, _ = net.shapes[n.out]
    return tune_cache.LayerShape(
        net.qfmt,
        batch * oh * ow,
        n.cout,
        n.cin,
        n.kernel_size,
        n.stride,
        n.padding,
        layer.in_fmt,
        layer.out_fmt,
        layer.res_fmt,
        bool(n.relu),
    )


def _fewest_bytes(net: QuantNet, name: str, batch: int) -> int:
    """Input, weights, residual and output each moved once: the quantized kernel's memory floor."""
    layer = net.convs[name]
    n = layer.node
    h, w, _ = net.shapes[n.inp]
    oh, ow, _ = net.shapes[n.out]
    out_px = batch * oh * ow
    total = batch * h * w * n.cin * ITEM_BYTES[layer.in_fmt] + n.cout * n.cin * n.kernel_size**2
    total += out_px * n.cout * ITEM_BYTES[layer.out_fmt]
    if layer.res_fmt is not None:
        total += out_px * n.cout * ITEM_BYTES[layer.res_fmt]
    return int(total)


def time_stem_and_head(
    net: QuantNet, batch: int, resolution: int, device, stem_s: float | None = None, resident: bool = False
) -> list[dict[str, Any]]:
    """The stem (fp16 convolution + max-pool) and the head (average pool + classifier) timed at ``batch``.

    ``stem_s``: the stem's time at ``batch`` when the stem choice has measured it already (not timed again).
    ``resident``: the stem reads int8 pixels already in memory (no quantizing pass, 4 bytes a pixel).

    Why: the per-layer table covers the quantized convolutions; without these two rows the time
    outside them (in ResNet-50 at batch 256, about a sixth of the network) has no name. Each row has
    the fields of a `LayerTiming` dict that the table reads (``mode`` 'fp16': their ceiling is fp16's;
    the int8 stem's is 'q').
    """
    n = net.stem.conv
    x = torch.randn(batch, 3, resolution, resolution, device=device).half()
    x = x.contiguous(memory_format=torch.channels_last)
    oh, ow, _ = net.shapes[n.out]
    ph, pw, c_stem = net.shapes[net.stem.out]
    stem_out = batch * ph * pw * c_stem * ITEM_BYTES[net.stem.out_fmt]
    st = net.stem
    stem_bytes = _stem_bytes(net, x, stem_out, resident)
    if st.kernel == "int8" and resident:  # the row times the stem on the int8 pixels it reads
        x = st.quantize(x, net.stem_backend)
    h, w, c = net.shapes[net.head.inp]
    y = torch.zeros(batch * h * w, c, device=device).to(layers.DTYPES[net.fmts[net.head.inp]])
    fc = net.head.weight
    k_stem = n.cin * n.kernel_size**2
    stem_kind = _stem_kind(st, net.stem_backend)
    stem_mode = "q" if st.kernel == "int8" else "fp16"  # the int8 stem's roof is the 8-bit one
    rows = []
    for name, fn, known, macs, nbytes, gemm, kernel, mode in (
        (
            "stem",
            lambda: net.run_stem(x, net.stem_backend),
            stem_s,
            batch * oh * ow * n.cout * k_stem,
            stem_bytes,
            (batch * oh * ow, n.cout, k_stem),
            stem_kind,
            stem_mode,
        ),
        (
            "head",
            lambda: net.run_head(y, batch),
            None,
            batch * fc.numel() + y.numel(),
            y.numel() * y.element_size() + fc.numel() * fc.element_size(),
            (batch, fc.shape[0], fc.shape[1]),
            {"triton": "triton pool + torch"}.get(getattr(net, "head_kernel", "torch"), "torch"),
            "fp16",
        ),
    ):
        if known is not None:
            t = known
        else:
            with torch.inference_mode():
                t = time_s(fn, reps=5, device=str(device))
        rows.append(
            {
                "name": name,
                "macs": int(macs),
                "q_s": t if mode == "q" else None,
                "fp16_s": None if mode == "q" else t,
                "config": "",
                "q_error": None,
                "mode": mode,
                "kernel": kernel,
                "gemm": list(gemm),
                "bytes": int(nbytes),
                "from_cache": False,
            }
        )
    _sync(device)
    return rows


_STEM_KINDS = {("fused", False): "fused", ("int8", False): "int8-pixel", ("int8", True): "int8-s2d"}


def _stem_kind(st: Any, backend: str) -> str:
    """The stem row's kernel: the fused or int8-pixel Triton stem and its tile, or cuDNN and the max-pool's."""
    pad = f"+pad{st.pad_channels}" if st.pad_channels else ""
    if getattr(st, "pool_cfg", None):  # the int8-pixel stem with the max-pool inside (`quant.stem_pool`)
        return "int8-pixel+pool triton {}x{} pooled, {}w{}s".format(*st.pool_cfg)
    if st.kernel in ("fused", "int8"):
        walk = f" persistent {st.fused_cfg[2]}/SM" if len(st.fused_cfg) > 2 else ""
        return (
            f"{_STEM_KINDS[st.kernel, getattr(st, 'super_pixels', False)]} triton {st.fused_cfg[0]}x{st.fused_cfg[1]}w"
            + walk
        )
    return f"cudnn{pad}+{backend} max-pool"


def _stem_bytes(net: QuantNet, x: torch.Tensor, stem_out: int, resident: bool) -> int:
    """Fewest bytes of the stem row: its input, weights and pooled output once (and a quantizing pass).

    The int8 stem reads 4-byte int8 pixels and int8 weights; in the default input mode its row also
    reads the fp16 batch and writes those pixels.
    """
    n = net.stem.conv
    if net.stem.kernel != "int8":
        return x.numel() * 2 + n.weight.numel() * 2 + stem_out
    from deepgap.measure.quant import stem_int8

    pixels = x.shape[0] * x.shape[2] * x.shape[3] * stem_int8.PIXEL
    return pixels + n.weight.numel() + stem_out + (0 if resident else x.numel() * 2 + pixels)


def time_layer(
    net: QuantNet,
    name: str,
    batch: int,
    opts,
    backend_ok: bool,
    cache: tune_cache.TuneCache | None = None,
) -> LayerTiming:
    """Self-check and time one convolution's quantized candidates and its fp16 path.

    With a tuning-cache hit only the cached candidate is checked and timed, and the fp16 time is the
    cached one; a hit that fails its check (or is no longer a candidate) is tuned in full.
    """
    layer = net.convs[name]
    n = layer.node
    h, w, _ = net.shapes[n.inp]
    oh, ow, _ = net.shapes[n.out]
    dev = layer.w_q.device
    shape = layer_shape(net, name, batch)
    t = LayerTiming(
        name=name,
        macs=batch * oh * ow * n.cout * n.cin * n.kernel_size**2,
        gemm=(shape.m, n.cout, n.cin * n.kernel_size**2),
        bytes=_fewest_bytes(net, name, batch),
    )
    x = rand_act(batch * h * w, n.cin, layer.in_fmt, dev)
    res = rand_act(batch * oh * ow, n.cout, layer.res_fmt, dev) if n.residual else None
    cb = min(CHECK_BATCH, batch)
    xs = x[: cb * h * w]
    rs = res[: cb * oh * ow] if res is not None else None
    ref = layers.conv_reference(layer, xs, (cb, h, w), rs)
    cands = candidates(net, name, batch, opts, backend_ok)
    hit = cache.get(shape) if cache is not None else None
    if hit is not None and (hit.backend, hit.config) in cands:
        best, errors = _best_of(net, name, [(hit.backend, hit.config)], x, xs, res, rs, ref, batch, cb, opts)
        if best is not None and (hit.fp16_s is not None or not opts.per_layer_choice):
            cache.hits += 1
            t.q_s, t.kernel, t.config = best[0], best[1], best[2].label if best[2] else None
            t.fp16_s, t.from_cache = hit.fp16_s, True
            net.backend[name], net.configs[name] = best[1], best[2]
            return t
    if cache is not None:
        cache.misses += 1
    best, errors = _best_of(net, name, cands, x, xs, res, rs, ref, batch, cb, opts)
    if best is not None:
        t.q_s, t.kernel, t.config = best[0], best[1], best[2].label if best[2] else None
        net.backend[name], net.configs[name] = best[1], best[2]
    if errors:
        t.q_error = "; ".join(errors)[:1000]
    if opts.per_layer_choice or best is None:
        t.fp16_s = _time_fp16(layer, (batch, h, w), res, backend_ok, opts, t)
    if cache is not None and best is not None and (t.fp16_s is not None or not opts.per_layer_choice):
        cache.put(shape, tune_cache.Choice(best[1], best[2], best[0], t.fp16_s))
    return t


def candidates(net: QuantNet, name: str, batch: int, opts, backend_ok: bool) -> list[tuple[str, Any]]:
    """(backend, tile) pairs that `time_layer` times for convolution ``name``, in order."""
    n = net.convs[name].node
    oh, ow, _ = net.shapes[n.out]
    m = batch * oh * ow
    cands: list[tuple[str, Any]] = []
    if backend_ok and opts.force_backend != "torch":
        cfgs = candidate_configs(m, n.cout, n.cin, net.qfmt, n.residual is not None)
        cands += [("triton", c) for c in (cfgs if opts.autotune else cfgs[:1])]
        if opts.autotune:  # the persistent TMA kernel's tiles (none with DEEPGAP_QUANT_GEMM=off)
            from deepgap.measure.quant.persistent import programs

            dev = net.convs[name].w_q.device
            cc = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
            sms = programs(dev)
            cands += [("triton", c) for c in persistent_configs(n, m, cc, net.qfmt, sms)]
            from deepgap.measure.quant.conv_tma import tma_configs

            cands += [("triton", c) for c in tma_configs(n, oh, ow, cc)]  # DEEPGAP_QUANT_CONV_TMA=on only
            if small_batch_offered():  # split-K where the tiles leave most SMs idle (batch 1); spread: a GPU
                split = split_k.split_configs(cfgs, m, n.cout, n.kernel_size**2 * n.cin, sms, spread=bool(cc))
                cands += [("triton", c) for c in split]
    if opts.force_backend != "triton":
        cands.append(("torch", None))
    return cands


def checked_time(
    check: Callable[[], str | None], run: Callable, reps: int, device, same=False
) -> float | str:
    """Seconds of ``run()`` (`time_s`) once ``check()`` found nothing wrong, else what it found or what raised.

    The tuner's rule for every candidate it may keep (a layer's tile, a fused pair's, the benches'): checked on
    a few images against the exact reference first, with ``same`` for the same bits from two runs of the whole
    batch on a GPU (`repeats.at_batch_on_gpu`), then timed on it.
    """
    try:
        why = check() or (at_batch_on_gpu(run, device) if same else None)
        return why if why is not None else time_s(run, reps, str(device))
    except Exception as exc:  # noqa: BLE001 - a failing kernel is reported and skipped
        _sync(device)
        return f"{type(exc).__name__}: {_first_line(exc)}"


def _best_of(net, name, cands, x, xs, res, rs, ref, batch, cb, opts):
    """(fastest (seconds, backend, config) among the candidates that pass the self-check, errors)."""
    layer = net.convs[name]
    dev = layer.w_q.device
    errors: list[str] = []
    best: tuple[float, str, Any] | None = None
    for backend, cfg in cands:
        if backend == "torch" and best is not None:
            break  # the torch path is a fallback, not a contender
        net.backend[name], net.configs[name] = backend, cfg
        check = lambda: _agree(net.run_conv(name, xs, cb, rs), ref, layer.out_fmt)  # noqa: E731
        got = checked_time(check, lambda: net.run_conv(name, x, batch, res), opts.timing_reps, dev, same=True)
        if isinstance(got, str):
            errors.append(f"{backend} {cfg.label if cfg else ''}: {got}")
        elif best is None or got < best[0]:
            best = (got, backend, cfg)
    return best, errors


def _time_fp16(layer, nhw, res, backend_ok: bool, opts, t: LayerTiming) -> float | None:
    """Seconds of the fp16 path (cuDNN convolution + the fused epilogue), None when it fails."""
    n = layer.node
    batch, h, w = nhw
    dev = layer.w_q.device
    xh = rand_act(batch * h * w, n.cin, "fp16", dev)

    def fp16_path():
        acc = fp16_conv(xh, (batch, h, w), layer.w_half, n.stride, n.padding)
        if backend_ok:
            return _epi(acc, layer, res)
        return layers.epilogue_reference(
            acc.float(), layer.alpha, layer.beta, layer.out_fmt, n.relu, res, layer.gamma
        )

    try:
        return time_s(fp16_path, opts.timing_reps, str(dev))
    except Exception as exc:  # noqa: BLE001
        t.q_error = ((t.q_error or "") + f"; fp16: {type(exc).__name__}: {exc}")[:1000]
        return None


def _first_line(exc: BaseException) -> str:
    return (str(exc) or "?").splitlines()[0][:200]


def _sync(device) -> None:
    """Synchronize after a failed launch; a sticky CUDA error then surfaces at the next real call."""
    if str(device).startswith("cuda"):
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()


def _epi(acc, layer, res):
    return kernels.epilogue(acc, layer.alpha, layer.beta, layer.out_fmt, layer.node.relu, res, layer.gamma)
