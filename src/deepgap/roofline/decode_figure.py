"""The decode roofline: each decode configuration at its FLOPs per byte and achieved TFLOP/s, under its ceilings.

Drawn as `deepgap.roofline.figures` draws the CNN rooflines (spec ceilings dashed, measured solid, one colour
per precision), from `deepgap.analysis.decode.decode_table`'s columns: ``intensity_flop_per_byte`` (FLOPs per
token ÷ bytes per token: weights at their precision and the KV cache at the mean context), ``achieved_tflops``
(decode tokens/s × FLOPs per token), the device's ``bandwidth_gb_s`` and ``peak_tflops`` and where they come
from (``bound_source``). Each point is labelled with its batch and its share of the memory bound, so the
figure says what the report's decode roofline table says: how far decode is from its memory bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepgap.core.records import kv_cache_suffix
from deepgap.roofline import model as rm
from deepgap.roofline.figures import MARKERS, PREC_COLORS, _axes_labels, _draw_ceilings, _figure, _unavailable

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


def placed(tab: pd.DataFrame) -> pd.DataFrame:
    """The rows a decode roofline can place: ok, with a positive intensity and achieved rate."""
    import pandas as pd

    if tab is None or tab.empty:
        return tab
    ok = tab[tab["status"] == "ok"]
    ai = pd.to_numeric(ok["intensity_flop_per_byte"], errors="coerce")
    ach = pd.to_numeric(ok["achieved_tflops"], errors="coerce")
    return ok[(ai > 0) & (ach > 0)]


def decode_ceilings(rows: pd.DataFrame) -> list[rm.Ceiling]:
    """One ceiling per device and precision with both a bandwidth and a compute peak (measured or sheet)."""
    out: dict[tuple, rm.Ceiling] = {}
    for r in rows.to_dict("records"):
        bw, pk = float(r.get("bandwidth_gb_s") or "nan"), float(r.get("peak_tflops") or "nan")
        if not (bw > 0 and pk > 0):
            continue
        measured = "measured" in str(r.get("bound_source"))
        key = (r["device_name"], r["precision"], measured)
        label = f"{r['device_name']} {'measured' if measured else 'spec'} {r['precision']}"
        out.setdefault(
            key, rm.Ceiling(label, str(r["precision"]), pk, bw, "measured" if measured else "spec")
        )
    return list(out.values())


def decode_roofline_figure(tab: pd.DataFrame) -> Figure:
    """Every successful decode configuration on its device's roofline (see the module docstring)."""
    fig, (ax,) = _figure()
    rows = placed(tab)
    if rows is None or rows.empty:
        _unavailable(ax, "no successful decode configuration with FLOPs and bytes per token")
        return fig
    ceilings = decode_ceilings(rows)
    ais = list(rows["intensity_flop_per_byte"]) + [c.ridge_flop_per_byte for c in ceilings]
    _draw_ceilings(ax, ceilings, min(ais) / 3, max(ais) * 3)
    models = sorted(set(rows["model"]))
    for r in rows.to_dict("records"):
        ax.scatter(
            r["intensity_flop_per_byte"],
            r["achieved_tflops"],
            marker=MARKERS[models.index(r["model"]) % len(MARKERS)],
            color=PREC_COLORS.get(r["precision"], "k"),
            edgecolor="k",
            lw=0.4,
            s=42,
            zorder=3,
        )
        share = r.get("fraction_of_bound")
        note = f" {share:.2f}× mem. bound" if share == share and share is not None else ""
        if str(r.get("device")) == "cpu":  # no sheet ceiling: say which CPU it is
            note += f" ({r['device_name']})"
        kv = kv_cache_suffix(r.get("kv_cache"))  # an fp8 cache's point never reads as the own dtype's
        ax.annotate(
            f"{r['engine']} {r['precision']}{kv} bs{int(r['batch_size'])}{note}",
            (r["intensity_flop_per_byte"], r["achieved_tflops"]),
            fontsize=6,
            xytext=(3, 3),
            textcoords="offset points",
        )
    for i, m in enumerate(models):
        ax.scatter([], [], marker=MARKERS[i % len(MARKERS)], color="w", edgecolor="k", label=m)
    _axes_labels(
        ax,
        "Decode roofline (one decode step per point)",
        "Arithmetic intensity (FLOP/byte: weights at their precision + KV cache at the mean context)",
    )
    ax.legend(fontsize=6, loc="lower right")
    return fig
