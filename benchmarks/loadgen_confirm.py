"""Issue 40's verdict from serve stores: deepgap's capacity beside LoadGen's, run by run, as Markdown.

Usage: python benchmarks/loadgen_confirm.py STORE... --out FILE.md
Per serve run with LoadGen levels (deepgap.serving.loadgen.capacities): deepgap's capacity and p99, LoadGen's
verdict and p99 at that rate, LoadGen's capacity and the ratio, the null-SUT floor, LoadGen's per-sample
latency minus deepgap's, LoadGen's settings and early stopping. The criterion: LoadGen's Server VALID at
≥ 0.95× deepgap's capacity on every run (per configuration: model, engine, precision, platform).
"""

from __future__ import annotations

import argparse
import sys

RATIO = 0.95


def ms(v) -> str:
    """Seconds as milliseconds, or a dash."""
    return "–" if v is None or v != v else f"{float(v) * 1e3:.2f}"


def main(argv: list[str] | None = None) -> int:
    """Write the table and the verdicts; exit 0 (the verdicts are in the file, not the exit status)."""
    import pandas as pd

    from deepgap.serving.loadgen.capacities import loadgen_capacities
    from deepgap.serving.show import tables
    from deepgap.store import Store

    ap = argparse.ArgumentParser()
    ap.add_argument("stores", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    frames = []
    for path in a.stores:
        st = Store(path, readonly=True)
        try:
            t = loadgen_capacities(tables.levels(st), tables.capacity(st))
        finally:
            st.close()
        if len(t):
            frames.append(t.assign(store=path))
    lines = ["# LoadGen against deepgap's server capacity (issue 40)", ""]
    if not frames:
        lines.append("No serve run with LoadGen levels in " + ", ".join(a.stores))
    else:
        df = pd.concat(frames, ignore_index=True)
        lines += [
            "| run | platform | config | SLO ms | deepgap q/s | deepgap p99 | LoadGen at it | its p99 "
            "| LoadGen q/s | LoadGen/deepgap | floor p99 | per-sample Δ p99 | issue delay p99 "
            "| duration s / queries | early stopping |",
            "|" + "---|" * 15,
        ]
        for r in df.to_dict("records"):
            cfg = f"{r['model']} {r['engine']} {r['precision']}"
            lg = (
                f"{r['loadgen_capacity_qps']:,.0f}"
                if r["loadgen_capacity_qps"]
                else (f"INVALID ≥ {r['lowest_tried_qps']:,.0f}")
            )
            ratio = f"{r['loadgen_over_deepgap']:.3f}" if r["loadgen_over_deepgap"] else "–"
            lines.append(
                f"| {r['run_id']} | {r['platform']} | {cfg} | {ms(r['slo_s'])} | "
                f"{r['deepgap_qps']:,.0f} | {ms(r['deepgap_p99_s'])} | {r['loadgen_result']} | "
                f"{ms(r['loadgen_p99_s'])} | {lg} | "
                f"{ratio} | {ms(r['floor_p99_s'])} | {ms(r['per_sample_diff_p99_s'])} | "
                f"{ms(r['issue_delay_p99_s'])} | {r['min_duration_s']} / {r['min_queries']} | "
                f"{r['early_stopping']} |"
            )
        lines += ["", f"Criterion: LoadGen Server VALID at ≥ {RATIO}× deepgap's capacity on every run.", ""]
        for (plat, model, eng, prec), g in df.groupby(["platform", "model", "engine", "precision"]):
            ok = [bool(x) and x >= RATIO for x in g["loadgen_over_deepgap"].fillna(0)]
            verdict = "PASS" if all(ok) and len(ok) >= 3 else "FAIL" if not all(ok) else "fewer than 3 runs"
            lines.append(f"- {plat} {model} {eng} {prec}: {sum(ok)} of {len(ok)} runs confirmed — {verdict}")
    with open(a.out, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
