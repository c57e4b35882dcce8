"""Where the quant engine's build time goes, in a fresh process: calibration, per-layer tuning, graph capture.

The default GPU sweep spends most of its quant time in `prepare_quant` (setup_s of 25–40 s for the first
configuration of a precision in a worker process). This runs one `prepare_quant` under cProfile and prints
the phases and the heaviest functions, so the cost can be named before it is removed. Run it twice in
separate processes to see what the on-disk caches (Triton's, deepgap's calibration and tuning caches) save.

    python benchmarks/quant_build_time.py [--model resnet50] [--precision int8] [--batch 1] [--no-tune-cache]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--no-tune-cache", action="store_true", help="time every tile candidate (ignore the cache)"
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    import torch
    import torchvision

    from deepgap.measure.quant.prepare import QuantOptions, prepare_quant

    t_import = time.perf_counter() - t0
    model = getattr(torchvision.models, args.model)().eval()
    opts = QuantOptions(log=lambda s: print(f"  [{time.perf_counter() - t0:7.2f}s] {s}", flush=True))
    if args.no_tune_cache and hasattr(opts, "tune_cache"):
        opts.tune_cache = False
    prof = cProfile.Profile()
    t1 = time.perf_counter()
    prof.enable()
    res = prepare_quant(model, args.precision, args.batch, 224, args.model, device="cuda", opts=opts)
    torch.cuda.synchronize()
    prof.disable()
    total = time.perf_counter() - t1
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(args.top)
    print(s.getvalue())
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.top)
    print(s.getvalue())
    info = res.info
    print(
        f"imports {t_import:.2f}s  prepare_quant {total:.2f}s  plan_seconds {info.get('plan_seconds')}  "
        f"tune cache {info.get('tune_cache', '-')}"
    )


if __name__ == "__main__":
    main()
