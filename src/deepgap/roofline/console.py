"""The console output of ``deepgap profile`` and ``deepgap peaks``: one profile, the summary, the ceilings.

Why here: the commands only parse, call `deepgap.api` and print; what a profile or a ceiling looks like on
a terminal is the roofline feature's, beside its runs (`deepgap.roofline.profile_run`,
`deepgap.roofline.peaks_run`). Rich is imported inside the functions.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deepgap.roofline.peaks_run import PeaksRun
    from deepgap.roofline.profile import ProfileResult
    from deepgap.roofline.profile_run import ProfileRun


def console() -> Any:
    """A rich console, 160 columns wide when the output is not a terminal."""
    from rich.console import Console

    return Console(width=None if Console().is_terminal else 160)


def _busy(res: ProfileResult) -> str:
    b = res.details.busy_fraction
    return f"; kernels busy {100 * b:.0f}% of the step" if b is not None else ""


def _num(v: float, fmt: str) -> str:
    return "" if v != v else format(v, fmt)


def print_profile(out: Any, res: ProfileResult, top: int) -> None:
    """One profile as it finishes: its headline, clusters, ``top`` kernels and ncu's summary."""
    from rich.table import Table

    s = res.spec
    if res.status != "ok":
        out.print(f"[yellow]{s.label()}: {res.status}: {res.reason}[/yellow]")
        return
    out.print(
        f"[bold]{s.label()}[/bold] on {s.device}: {res.step_time_median_s * 1e3:.2f} ms/step, "
        f"{res.throughput_ips:,.0f} {_rate_unit([s.model])}, {_gflop(res.flops_per_step)} GFLOP/step → "
        f"{res.achieved_tflops:.3g} TFLOP/s" + _busy(res)
    )
    if res.details.busy_fraction is None and res.kernel_time_per_step_s:  # a CPU: op times, not kernels
        out.print(
            f"op times below are under torch.profiler: {res.kernel_time_per_step_s * 1e3:.2f} ms/step in all "
            f"against the {res.step_time_median_s * 1e3:.2f} ms/step timed without it (the profiler's own cost "
            "on a CPU); their shares hold, their sum and TFLOP/s are the profiled step's"
        )
    t = Table(
        "cluster", "kernels", "launches", "ms/step", "time %", "GFLOP", "MB", "FLOP/B", "TFLOP/s", "GB/s"
    )
    for _, c in res.clusters.iterrows():
        t.add_row(
            c["cluster"],
            str(int(c["kernels"])),
            _num(c["launches_per_step"], ",.0f"),
            _num(c["time_per_step_s"] * 1e3, ".3f"),
            _num(100 * c["time_share"], ".1f"),
            _num(c["flops_per_step"] / 1e9, ",.2f"),
            _num(c["bytes_per_step"] / 1e6, ",.1f"),
            _num(c["intensity_flop_per_byte"], ",.1f"),
            _num(c["achieved_tflops"], ".3g"),
            _num(c["bandwidth_gb_s"], ",.0f"),
        )
    out.print(t)
    if top and res.kernels is not None and len(res.kernels):
        k = Table("top kernels", "cluster", "launches", "ms/step", title=None)
        for _, r in res.kernels.head(top).iterrows():
            k.add_row(
                r["short_name"][:90],
                r["cluster"],
                f"{r['launches_per_step']:.0f}",
                f"{r['time_per_step_s'] * 1e3:.3f}",
            )
        out.print(k)
    if res.ncu:
        n = res.ncu
        if n.get("status") == "ok":
            sm = n.get("summary", {})
            out.print(
                f"ncu (seed formulas, per step): time {sm.get('time_s', 0) * 1e3:.2f} ms, "
                f"DRAM {sm.get('dram_gb_s', 0):,.1f} GB/s, fp32 CUDA-core {sm.get('gflop_s', 0):,.1f} "
                f"GFLOP/s, intensity {sm.get('intensity_flop_per_byte', 0):.2f} FLOP/B "
                f"({sm.get('launches_per_step', 0):.0f} kernels)"
            )
        else:
            why = str(n.get("reason", ""))
            text = why if why.startswith("unavailable") else f"{n.get('status')}: {why}"
            out.print(f"[yellow]ncu: {text}[/yellow]")


def profile_summary(run: ProfileRun) -> Any:
    """The table of every profile of a run, titled with the device, the run and the store."""
    from rich.table import Table

    t = Table(
        "model",
        "mode",
        "precision",
        "batch",
        "ms/step",
        _rate_unit([r.spec.model for r in run.results]),
        "GFLOP/step",
        "TFLOP/s",
        "busy %",
        "ncu",
        title=f"profiles on {run.env.get('device_name')} — run {run.run_id} in {run.store_path}",
    )
    for r in run.results:
        s = r.spec
        if r.status != "ok":
            t.add_row(
                s.model, s.mode, s.precision, str(s.batch_size), r.status, "", "", "", "", r.reason[:40]
            )
            continue
        t.add_row(
            s.model,
            s.mode,
            s.precision,
            str(s.batch_size),
            f"{r.step_time_median_s * 1e3:.2f}",
            f"{r.throughput_ips:,.0f}",
            _gflop(r.flops_per_step),
            f"{r.achieved_tflops:.3g}",
            "" if r.details.busy_fraction is None else f"{100 * r.details.busy_fraction:.0f}",
            (r.ncu or {}).get("status", "not asked"),
        )
    return t


def peaks_json(run: PeaksRun) -> str:
    """The ceilings as one JSON document (``--json``)."""
    return json.dumps(
        {
            "run_id": run.run_id,
            "device": run.device,
            "device_name": run.env.get("device_name"),
            "spec": run.sheet,
            "peaks": [p.to_dict() for p in run.peaks],
        },
        indent=1,
        default=str,
    )


def peaks_table(run: PeaksRun) -> Any:
    """The ceilings beside the spec sheet's, with how each was measured or why not."""
    from rich.table import Table

    from deepgap.roofline.specs import spec_peak

    spec = run.sheet
    t = Table(
        "ceiling",
        "measured",
        "unit",
        "spec sheet",
        "% of spec",
        "how / why not",
        title=f"ceilings of {run.env.get('device_name')} ({run.device})"
        + (f" — spec row: {spec['gpu']}" if spec else ""),
    )
    for p in run.peaks:
        s = spec_peak(spec, p.name)
        val = f"{p.value:,.2f}" if p.value is not None else "—"
        pct = f"{100 * p.value / s:.0f}%" if p.value is not None and s else ""
        how = (
            (f"{p.details.get('op', '')} n={p.details['m']}" if "m" in p.details else p.details.get("op", ""))
            if p.status == "ok"
            else p.reason
        )
        t.add_row(p.name, val, p.unit, f"{s:,.1f}" if s else "—", pct, how)
    return t


def _rate_unit(models: list[str]) -> str:
    """Items a second as the models count them: seq/s for text models, img/s for images, samples/s for both.

    Why: a text model's profile said "img/s" (`deepgap.render.units` words every other view so).
    """
    from deepgap.measure.models.inputs import is_text
    from deepgap.render.units import of_seq_lens

    return of_seq_lens([1 if is_text(m) else None for m in models]).short


def _gflop(flops: float) -> str:
    """GFLOP a step to three significant figures: a tiny model's 0.03 GFLOP printed as "0.0"."""
    return f"{flops / 1e9:,.3g}" if flops < 1e12 else f"{flops / 1e9:,.0f}"
