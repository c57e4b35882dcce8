"""Compile a network's Triton tile candidates all at once, before the tuner times them one by one.

Why a module of its own: it is the one place that leans on Triton internals (`AsyncCompileMode`) for
set-up time alone; the tuner (`tuning`) works the same without it, only slower from cold caches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from deepgap.measure.quant import tunecache as tune_cache
from deepgap.measure.quant.network import QuantNet
from deepgap.measure.quant.tuning import candidates, layer_shape, rand_act


def precompile(
    net: QuantNet,
    batch: int,
    opts,
    backend_ok: bool,
    cache: tune_cache.TuneCache | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """Compile the Triton kernels that `time_layer` will launch, all at once on a thread pool.

    Why: with cold caches a network's set-up is mostly compiling its tile candidates (dozens of
    kernels, each through Triton's code generator, LLVM and ptxas), one after another as the tuning
    loop first launches them. Submitted together under Triton's `AsyncCompileMode`, the compiles
    overlap where they leave the interpreter (ptxas, for one, is a subprocess); the timing loop then
    finds every kernel compiled. With a tuning-cache hit only the cached tile is compiled, as only it
    is timed. Nothing is launched: launches run in `launch.compile_only` (tiny one-image inputs give
    the same specialization, since the kernels do not specialize on the row count). A Triton without
    `AsyncCompileMode`, or a compile that fails here, changes nothing: the kernel is compiled, or
    fails, at its first launch as before.
    """
    first = next(iter(net.convs.values()), None)
    dev = first.w_q.device if first is not None else torch.device("cpu")
    if dev.type != "cuda" or not backend_ok or opts.force_backend == "torch":
        return {"kernels": 0, "skipped": "no Triton kernels to compile"}

    def launches():
        for name, layer in net.convs.items():
            n = layer.node
            h, w, _ = net.shapes[n.inp]
            oh, ow, _ = net.shapes[n.out]
            cands = [c for c in candidates(net, name, batch, opts, backend_ok) if c[0] == "triton"]
            hit = cache.get(layer_shape(net, name, batch)) if cache is not None else None
            if hit is not None and (hit.backend, hit.config) in cands:
                cands = [(hit.backend, hit.config)]
            x = rand_act(h * w, n.cin, layer.in_fmt, dev)
            res = rand_act(oh * ow, n.cout, layer.res_fmt, dev) if n.residual else None
            for backend, cfg in cands:

                def go(name=name, backend=backend, cfg=cfg, x=x, res=res):
                    net.backend[name], net.configs[name] = backend, cfg
                    net.run_conv(name, x, 1, res)

                yield go

    saved = dict(net.backend), dict(net.configs)
    try:
        return compile_all(launches(), workers)
    finally:
        net.backend, net.configs = saved


def compile_all(launches: Iterable[Callable[[], object]], workers: int | None = None) -> dict[str, Any]:
    """Call each of ``launches`` (a Triton kernel's launch) to compile it, all compiles on a thread pool.

    The launches run inside `launch.compile_only` under Triton's `AsyncCompileMode`: each submits its
    compile and returns unrun. One that raises is passed over (its first real launch meets it). The CNN
    network's tiles (`precompile`) and the transformer Linears' (`linear_choice.precompile`) both go here.
    """
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return {"kernels": 0, "skipped": "this Triton has no AsyncCompileMode"}
    from concurrent.futures import ThreadPoolExecutor

    from deepgap.measure.quant import launch

    workers = workers or max(
        1,
        min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)),
    )
    t0, submitted = time.perf_counter(), 0
    with (
        ThreadPoolExecutor(workers) as pool,
        AsyncCompileMode(pool, ignore_errors=True),
        launch.compile_only(),
        torch.inference_mode(),
    ):
        for go in launches:
            try:
                go()
                submitted += 1
            except Exception:  # noqa: BLE001 - the first real launch meets and reports it
                pass
    return {"kernels": submitted, "workers": workers, "seconds": round(time.perf_counter() - t0, 3)}
