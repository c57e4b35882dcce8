"""Where serve's compute per batch parts from the engine alone: each step of the served path timed back to back.

Why (issue 47, session 47): `serve` reports compute (normalise + engine) per batch of 128 about 4% above the engine
alone held 1 s on device-resident inputs (2.56 vs 2.45 ms on one H100), which caps capacity / engine near 0.95.
This builds the same engine and the same `PipelinedExecutor` serve uses and times, interleaved over rounds so
that clock drift falls on every mode alike, windows of about ``--window`` seconds each (after one unheld window):

- ``engine``: the engine alone on its bound input (`PipelinedExecutor.engine_interval_s`: serve's comparator);
- ``norm``: serve's normaliser alone (uint8 NHWC → the engine's input), back to back; ``norm torch``: torch's
  ``addcmul`` path, the one serve ran before session 47's kernel (`serving.worker.normalise_kernel`);
- ``norm+engine``: both, back to back on one stream, no copies (serve's compute step without the copy stream);
- ``engine|copies``: the engine alone while the copy stream runs host→device batch copies without pause;
- ``pipeline``: the full path, ``depth`` batches in flight (`pipelined_interval_s`'s loop), with its mean
  per-batch h2d and compute from the executor's own events (what serve's "compute" line reports).

Each window also records NVML's SM clock, power and temperature at its end.

    python benchmarks/serve_gap.py --precision fp8 --batch 128 --rounds 3 --out $OUT/serve_gap.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import deque

import torch

from deepgap.measure.device import CudaEventClock


def nvml_now() -> dict:
    """SM clock (MHz), power (W) and temperature (°C) now, or {} without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return {
            "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "watts": pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
            "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        }
    except Exception:  # noqa: BLE001 - telemetry is optional here
        return {}


def events_s(enqueue, n: int, stream) -> float:
    """Seconds per call of ``enqueue()`` run ``n`` times back to back on ``stream``: deepgap's own event clock
    (`CudaEventClock.time_window`, the device synchronised first) with ``stream`` current."""
    with torch.cuda.stream(stream):
        return CudaEventClock(str(stream.device)).time_window(enqueue, n) / n


def pipeline_s(ex, b: int, n: int) -> dict:
    """The full served path ``n`` batches back to back: seconds between completions, mean h2d and compute."""
    q: deque = deque()
    parts, done = [], []
    for i in range(n):
        if len(q) >= ex.depth:
            parts.append(ex.wait(q.popleft()))
            done.append(time.perf_counter())
        q.append(ex.submit(i * b, b))
    while q:
        parts.append(ex.wait(q.popleft()))
        done.append(time.perf_counter())
    return {
        "s": (done[-1] - done[0]) / (len(done) - 1),
        "h2d_s": statistics.mean(p[0] for p in parts),
        "compute_s": statistics.mean(p[1] for p in parts),
    }


def main() -> None:  # noqa: D103
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--precision", default="fp8")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window", type=float, default=1.5, help="seconds per timed window")
    p.add_argument("--out", default=None)
    a = p.parse_args()

    from deepgap.measure.models.build import build_model
    from deepgap.measure.quant.prepare import QuantOptions, prepare_quant
    from deepgap.serving.worker.ring import InputRing, Normaliser
    from deepgap.serving.worker.server import PipelinedExecutor

    b = a.batch
    model = build_model(a.model, 224, None, 0)
    res = prepare_quant(model, a.precision, b, 224, a.model, opts=QuantOptions())
    ring = InputRing(max(1024, 2 * b), 224, pin=True)
    ex = PipelinedExecutor({b: res.run}, "cuda", torch.float16, True, ring)
    x, u8, ks, cs = ex.dev_in[b], ex.u8[0], ex.compute_stream, ex.copy_stream
    ex.ring.copy_batch(u8, 0, b)
    per = ex.engine_interval_s(b, 20)
    n = max(20, int(a.window / per))

    def engine() -> dict:
        return {"s": ex.engine_interval_s(b, n)}

    def norm() -> dict:
        return {"s": events_s(lambda: ex.norm(u8[:b], x), n, ks)}

    torch_norm = Normaliser(torch.float16, "cuda", backend="torch")

    def norm_torch() -> dict:
        return {"s": events_s(lambda: torch_norm(u8[:b], x), n, ks)}

    def norm_engine() -> dict:
        return {"s": events_s(lambda: (ex.norm(u8[:b], x), res.run(x)), n, ks)}

    spare = ex.u8[1]
    per_copy = events_s(lambda: ring.copy_batch(spare, 0, b, non_blocking=True), 5, cs)
    k = max(1, round(per / per_copy))  # copies per engine call that keep the copy stream busy throughout

    def engine_copies() -> dict:
        def both() -> None:
            with torch.cuda.stream(cs):
                for _ in range(k):
                    ring.copy_batch(spare, 0, b, non_blocking=True)
            res.run(x)

        r = {"s": events_s(both, n, ks), "copy_s": per_copy}
        torch.cuda.synchronize()
        return r

    def pipeline() -> dict:
        return pipeline_s(ex, b, n)

    modes = {"engine": engine, "norm": norm, "norm torch": norm_torch, "norm+engine": norm_engine,
             "engine|copies": engine_copies, "pipeline": pipeline}  # fmt: skip
    rows = []
    with torch.inference_mode():
        for fn in modes.values():  # one unheld window each: warm-up, clocks to the held level
            fn()
        for rnd in range(a.rounds):
            for mode, fn in modes.items():
                r = fn()
                row = {"round": rnd, "mode": mode, "batch": b, "ms": r["s"] * 1e3, "img_s": b / r["s"],
                       **{k: v * 1e3 for k, v in r.items() if k.endswith("_s") and k != "s"}, **nvml_now()}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
                if a.out:
                    with open(a.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    print(
        f"\n{a.model} quant {a.precision} batch {b} on {torch.cuda.get_device_name()}: median of {a.rounds} rounds"
    )
    base = statistics.median(r["ms"] for r in rows if r["mode"] == "engine")
    for mode in modes:
        rs = [r for r in rows if r["mode"] == mode]
        ms = statistics.median(r["ms"] for r in rs)
        extra = "".join(
            f", {k} {statistics.median(r[k] for r in rs):.3f}"
            for k in ("h2d_ms", "compute_ms", "copy_ms")
            if k in rs[0]
        )
        clocks = f", SM {statistics.median(r['sm_mhz'] for r in rs):.0f} MHz" if "sm_mhz" in rs[0] else ""
        print(
            f"  {mode:14} {ms:7.3f} ms/batch ({b / ms * 1e3:9,.0f} img/s; {ms / base:.3f}× engine){extra}{clocks}"
        )


if __name__ == "__main__":
    main()
