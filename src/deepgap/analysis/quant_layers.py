"""The quant engine's own layers on a roofline: where its time goes and what bounds each layer.

Why: the network's img/s says how far the engine is from a goal, not which layer to work on next.
Each quant measurement stores, per layer, the GEMM it runs (M, N, K), its multiply-adds, the fewest
bytes its kernel must move (inputs, residual, weights and output once), the tile the autotuner chose
and the layer's time in the network's own batch (``extra["engine_info"]["layers"]``, written by
``quant.prepare``). Against one ceiling (a compute peak and the memory bandwidth under it, spec or
measured by ``deepgap peaks``) that gives each layer an arithmetic intensity, an attainable rate, the
share of the roof it reaches and its *headroom*: the time above its own roofline floor. The layer with
the largest headroom is the next bottleneck; a layer at its floor can only get faster by moving fewer
bytes (fusion) or doing fewer operations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from deepgap.core.result_details import EngineInfo, ResultDetails
from deepgap.roofline.model import Ceiling, bound, theoretical_time

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.store import Store

QUANT_ENGINE = "quant"
CONFIG_KEYS = ["device_name", "model", "precision", "batch_size"]  # one quant configuration


@dataclass(frozen=True)
class LayerRow:
    """One layer of one quant configuration (model, precision, batch), median over its measurements."""

    model: str
    precision: str  # the network's precision: int8 or fp8
    batch_size: int
    name: str  # the torchvision module name, e.g. layer1.0.conv3
    mode: str  # "q": 8-bit kernel; "fp16": kept in fp16 where that was faster or more exact
    kernel: str  # triton | torch
    tile: str  # the autotuner's choice, e.g. "128x64x64 w4 s1 er"
    gemm: tuple[int, int, int]  # M, N, K of the implicit GEMM
    ops: float  # 2 × multiply-adds per batch
    bytes: float  # fewest bytes per batch
    time_s: float  # the layer's time at this batch (the chosen kernel's)
    share: float  # of the sum over layers
    tops: float  # ops / time / 1e12
    intensity: float  # ops per byte
    attainable_tops: float  # min(peak, intensity × bandwidth); nan without a ceiling
    roof_fraction: float  # tops / attainable_tops
    floor_s: float  # max(ops / peak, bytes / bandwidth)
    headroom_s: float  # time_s − floor_s: what a perfect kernel could still save
    bound: str  # "compute" | "memory" (left or right of the ridge point); "" without a ceiling
    n: int  # measurements folded into the medians

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON, DataFrame)."""
        d = asdict(self)
        # a layer stored without its GEMM shape (older engines) says so, not "0x0x0"
        d["gemm"] = "x".join(str(v) for v in self.gemm) if any(self.gemm) else "–"
        return d


def _layer_time(layer: dict[str, Any]) -> float | None:
    t = layer.get("q_s") if layer.get("mode") == "q" else layer.get("fp16_s")
    return float(t) if t is not None else None


def layer_rows(
    model: str,
    precision: str,
    batch_size: int,
    measurements: list[list[dict[str, Any]]],
    ceilings: dict[str, Ceiling | None],
) -> list[LayerRow]:
    """The rows of one configuration from the ``layers`` lists of its measurements (medians per layer).

    ``ceilings`` maps a layer's mode to its roof: ``"q"`` → the 8-bit precision's, ``"fp16"`` → fp16's
    (the layers kept in fp16, the stem and the head).
    """
    import numpy as np

    by_name: dict[str, list[dict[str, Any]]] = {}
    for layers in measurements:
        for layer in layers:
            if _layer_time(layer) is not None:
                by_name.setdefault(str(layer["name"]), []).append(layer)
    times = {name: float(np.median([_layer_time(x) for x in ls])) for name, ls in by_name.items()}
    total = sum(times.values()) or float("nan")
    rows = []
    for name, ls in by_name.items():
        last = ls[-1]
        t = times[name]
        ops = 2.0 * float(last.get("macs") or 0.0)
        nbytes = float(last.get("bytes") or float("nan"))
        ceiling = ceilings.get(str(last.get("mode", "q")))
        ai = ops / nbytes if nbytes == nbytes and nbytes > 0 else float("nan")
        if ceiling is not None and ai == ai:
            att = ceiling.attainable_tflops(ai)
            floor = theoretical_time(ops, ceiling.peak_tflops, nbytes, ceiling.bandwidth_gb_s).bound_s
            side = bound(ai, ceiling)
        else:
            att, floor, side = float("nan"), float("nan"), ""
        tops = ops / t / 1e12 if t > 0 else float("nan")
        gemm = tuple(int(v) for v in (last.get("gemm") or (0, 0, 0)))
        rows.append(
            LayerRow(
                model,
                precision,
                int(batch_size),
                name,
                str(last.get("mode", "")),
                str(last.get("kernel", "")),
                str(last.get("config") or ""),
                gemm,
                ops,
                nbytes,
                t,
                t / total,
                tops,
                ai,
                att,
                tops / att if att == att and att > 0 else float("nan"),
                floor,
                t - floor,
                side,
                len(ls),
            )
        )
    return rows


def ceiling_for(precision: str, device_name: str, peaks_df=None) -> Ceiling | None:
    """The measured ceiling of ``precision`` when a peaks frame has it, else the spec sheet's, else None."""
    from deepgap.roofline.model import ceilings
    from deepgap.roofline.specs import spec_for

    found = ceilings(precision, peaks_df, spec_for(device_name), device_name)
    measured = [c for c in found if c.source == "measured"]
    return (measured or found or [None])[0]


def layers_frame(results: pd.DataFrame, peaks_df=None) -> pd.DataFrame:
    """Every quant configuration's layer table (one row per layer) from a store's results frame."""
    import pandas as pd

    if len(results) == 0:
        extra = ["device_name", "ceiling", "peak_tops", "bandwidth_gb_s", "network_s", "pairs_saved_s"]
        return pd.DataFrame(columns=list(LayerRow.__dataclass_fields__) + extra)
    ok = results[(results["engine"] == QUANT_ENGINE) & (results["status"] == "ok")]
    out: list[dict[str, Any]] = []
    for (device, model, precision, bs), grp in ok.groupby(CONFIG_KEYS, sort=True):
        infos = [ResultDetails.of(e).engine_info or EngineInfo() for e in grp["extra"]]
        lists = [
            (i.layers or []) + (i.outside_layers or [])
            for i in infos
            if isinstance(i.layers, list) and i.layers
        ]
        if not lists:
            continue
        ceiling = ceiling_for(str(precision), str(device), peaks_df)
        ceils = {"q": ceiling, "fp16": ceiling_for("fp16", str(device), peaks_df)}
        network = float(grp["latency_median_s"].median())  # the whole network's batch, stem and head included
        saved = _pairs_saved_s(infos)
        for r in layer_rows(str(model), str(precision), int(bs), lists, ceils):
            c = ceils.get(r.mode)
            out.append(
                {
                    **r.as_dict(),
                    "device_name": device,
                    "ceiling": c.label if c else "",
                    "peak_tops": c.peak_tflops if c else float("nan"),
                    "bandwidth_gb_s": c.bandwidth_gb_s if c else float("nan"),
                    "network_s": network,
                    "pairs_saved_s": saved,
                }
            )
    return pd.DataFrame(out)


def _pairs_saved_s(infos: list[EngineInfo]) -> float:
    """Seconds a batch saves by the fused 1×1 pairs the tuner kept (`quant.pair_choice`), median over measurements.

    A paired layer's row is its time alone, so the rows' sum counts each kept pair's two layers separately;
    the network ran the pair instead, ``separate_s − pair_s`` faster.
    """
    import numpy as np

    per = []
    for info in infos:
        pairs = (info.get("pairs") or {}).get("pairs") or []
        per.append(sum(p["separate_s"] - p["pair_s"] for p in pairs if p.get("kept") and p.get("pair_s")))
    return float(np.median(per)) if per else 0.0


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: the rows' times against the network's median, their floor, the top row.

    ``outside_layers_ms`` is the network's median batch time minus the sum of the rows' times, less what
    kept fused pairs save (``pairs_saved_ms``: their layers' rows are their times alone): the conversions
    and launch gaps that no row covers (and, in stores written before the stem and head were timed, those
    two as well).
    """
    import pandas as pd

    if len(frame) == 0:
        return pd.DataFrame()
    rows = []
    for key, g in frame.groupby(CONFIG_KEYS, sort=True):
        top = g.sort_values("headroom_s", ascending=False).iloc[0]
        saved = float(g["pairs_saved_s"].iloc[0]) if "pairs_saved_s" in g else 0.0
        mem = g[g["bound"] == "memory"]["time_s"].sum()
        # layers with a roof: a store without GEMM shapes has none (no floor, no side)
        placed = g["bound"] != ""
        rows.append(
            {
                "device_name": key[0],
                "model": key[1],
                "precision": key[2],
                "batch_size": key[3],
                "layers": len(g),
                "network_ms": g["network_s"].iloc[0] * 1e3,
                "layers_ms": g["time_s"].sum() * 1e3,
                "outside_layers_ms": (g["network_s"].iloc[0] - g["time_s"].sum() + saved) * 1e3,
                "pairs_saved_ms": saved * 1e3,
                "floor_ms": g["floor_s"].sum(min_count=1) * 1e3,  # NaN, not 0, where no layer has a floor
                "memory_bound_share": mem / g["time_s"].sum() if placed.any() else float("nan"),
                "tops": g["ops"].sum() / g["time_s"].sum() / 1e12,
                "next_bottleneck": top["name"],
                "its_headroom_ms": top["headroom_s"] * 1e3,
            }
        )
    return pd.DataFrame(rows)


def load(
    store_path: str | Store, run_ids: list[str] | None = None, peaks_df=None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(layers frame, `summary`) of a store's runs; ceilings from ``peaks_df``, else measured in the store."""
    from deepgap.roofline.storage import peaks_frame
    from deepgap.store import reading

    with reading(store_path) as store:  # a path, or the report build's open store
        results = store.results_frame(run_ids)
        if peaks_df is None:
            peaks_df = peaks_frame(store, run_ids)
    # the default input's layers: a resident-input row (same network, the stem fed int8) never pools with them
    if "input_mode" in results:
        results = results[results["input_mode"].astype(str) == ""]
    frame = layers_frame(results, peaks_df)
    return frame, summary(frame)
