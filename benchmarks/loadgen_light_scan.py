"""LoadGen's Server scenario against the light SUT on CUDA streams, over a ladder of target rates.

Why: the GPU test of the light SUT (tests/serving/test_loadgen_confirm.py) asked LoadGen for 20,000 queries/s at a
15 ms objective on a small conv net and got INVALID on the H100 host (p50 12 ms, p99 209 ms: the queue grew).
This scan measures, on the machine it runs on, which rates the light SUT sustains (VALID), LoadGen's own floor
(the null SUT) at each rate, and deepgap's agreement with LoadGen's trace, and writes one CSV row per rate.

Usage (GPU machine): python benchmarks/loadgen_light_scan.py OUT.csv [RATE ...]
"""

from __future__ import annotations

import csv
import sys


def main(argv: list[str]) -> int:
    """Run the ladder; write the CSV; print one line per rate."""
    import torch

    from deepgap.serving.loadgen.harness import LoadgenRequest, null_request
    from deepgap.serving.loadgen.sut import drive
    from deepgap.serving.sim.batcher import BatchPolicy
    from deepgap.serving.worker.ring import InputRing
    from deepgap.serving.worker.server import PipelinedExecutor

    out = argv[0]
    rates = [float(r) for r in argv[1:]] or [2000.0, 5000.0, 10000.0, 15000.0, 20000.0]
    net = (
        torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
        )
        .cuda()
        .half()
    )
    ring = InputRing(256, 32, seed=1, pin=True)
    ex = PipelinedExecutor({b: net for b in (1, 8, 32, 64)}, "cuda", torch.float16, True, ring)
    rows = []
    try:
        for qps in rates:
            floor = drive(
                None, null_request(LoadgenRequest("server", BatchPolicy(8, 1e-3), qps, 0.015, 2000, 0.5))
            )
            res = drive(ex, LoadgenRequest("server", BatchPolicy(64, 1e-3), qps, 0.015, 2000, 0.5))
            p = res.parsed
            row = {
                "target_qps": qps,
                "result": p.get("Result is", ""),
                "completed_qps": p.get("Completed samples per second", ""),
                "p50_ms": float(p.get("50.00 percentile latency (ns)", "nan")) * 1e-6,
                "p99_ms": float(p.get("99.00 percentile latency (ns)", "nan")) * 1e-6,
                "floor_p99_ms": float(floor.parsed.get("99.00 percentile latency (ns)", "nan")) * 1e-6,
                "agreement_diff_p99_ms": (res.agreement.diff_p99_s * 1e3) if res.agreement else "",
                "device": torch.cuda.get_device_name(0),
            }
            rows.append(row)
            print(row, flush=True)
    finally:
        ex.close()
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
