"""Where one configuration's set-up time goes, in a fresh process: any engine, under cProfile.

The default GPU sweep starts a worker process per sweep, so every engine's set-up (the quant engine's
calibration and per-layer tuning, torch.compile's tracing, freezing and code generation, CUDA graph
capture) is paid once per sweep. This builds one configuration the way the worker does
(`engines.get_engine(...).prepare`) under cProfile and prints the heaviest functions, so a cost can be
named before it is removed. Run it twice in separate processes to see what the on-disk caches save
(Triton's, Inductor's, deepgap's calibration and tuning caches); ``--json`` appends one line per run.
It generalizes `benchmarks/quant_build_time.py` (the quant engine only, kept for the seventh session's
commands) to every engine.

    python benchmarks/setup_time.py --engine quant --model resnet50 --precision int8 --batch 1
    python benchmarks/setup_time.py --engine compile-freeze --model resnet101 --precision fp16 --batch 256
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="quant")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--memory-format", default="channels_last")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--precompile-workers", type=int, help="quant: threads compiling the tiles first (0: none)"
    )
    ap.add_argument(
        "--no-profile", action="store_true", help="time only (cProfile slows Python-heavy set-up)"
    )
    ap.add_argument("--json", help="append a JSON line with the times to this file")
    args = ap.parse_args()
    t0 = time.perf_counter()
    import torch

    from deepgap.core.records import ConfigSpec
    from deepgap.measure.engines import get_engine
    from deepgap.measure.models.build import build_model

    t_import = time.perf_counter() - t0
    spec = ConfigSpec(args.model, args.engine, args.precision, args.batch, "cuda", args.memory_format)
    model = build_model(args.model, 224).eval()
    x = torch.randn(args.batch, 3, 224, 224)
    if args.memory_format == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    engine = get_engine(args.engine)
    prof = cProfile.Profile()
    t1 = time.perf_counter()
    if not args.no_profile:
        prof.enable()
    if args.engine == "quant" and args.precompile_workers is not None:  # the engine with one option changed
        from deepgap.measure.quant.prepare import QuantOptions, prepare_quant

        res = prepare_quant(
            model,
            args.precision,
            args.batch,
            224,
            args.model,
            device="cuda",
            opts=QuantOptions(precompile_workers=args.precompile_workers),
        )
        prepared = type("P", (), {"info": res.info})
    else:
        prepared = engine.prepare(model, spec, x)
    torch.cuda.synchronize()
    prof.disable()
    total = time.perf_counter() - t1
    for key in () if args.no_profile else ("cumulative", "tottime"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(args.top)
        print(s.getvalue())
    info = {
        k: v
        for k, v in prepared.info.items()
        if not isinstance(v, (list, dict)) or k in ("tune_cache", "precompile")
    }
    print(f"imports {t_import:.2f}s  prepare {total:.2f}s  info {info}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(
                json.dumps(
                    {"config": vars(args), "import_s": t_import, "prepare_s": total, "info": info},
                    default=str,
                )
                + "\n"
            )


if __name__ == "__main__":
    main()
