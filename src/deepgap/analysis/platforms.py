"""Two platforms of one (merged) store side by side: pick them by name, compare them, explain the ratios.

A store merged from two machines (``deepgap merge h100.sqlite h200.sqlite -o all.sqlite``) holds several
platforms; a row's ``platform`` is the device name its run's environment recorded (`frame.prepare`: torch's
name, e.g. ``NVIDIA H200`` or ``NVIDIA H100 80GB HBM3``). `compare_platforms` sets one platform's
configurations against another's exactly as ``deepgap compare A B`` sets two stores (`analysis.compare`:
matched configurations and each side at its best batch, every ratio with its bootstrap CI and both
configurations) and adds, per pair, the ratio the roofline predicts from each platform's ceilings
(`roofline.predict`). `side_by_side` gathers what a report section needs into documented DataFrames.
"""

from __future__ import annotations

from itertools import combinations
from typing import TYPE_CHECKING, Any

import pandas as pd

from deepgap.analysis.compare import SamplesFn, compare, provenance
from deepgap.core.errors import UsageError
from deepgap.core.stats import N_RESAMPLES
from deepgap.roofline.predict import IntensityFn, Roof, add_predictions, ceilings_table, roof_of

if TYPE_CHECKING:
    from deepgap.store import Store


def platform_names(agg: pd.DataFrame) -> list[str]:
    """The platforms of an aggregated frame, sorted."""
    return sorted(agg["platform"].dropna().astype(str).unique()) if len(agg) else []


def resolve_platform(query: str, names: list[str]) -> str:
    """The platform ``query`` names: an exact (case-insensitive) name, else the one name containing it.

    ``H200`` picks ``NVIDIA H200`` when no other platform's name contains ``H200``; an unknown or
    ambiguous query is a `UsageError` that lists the platforms.
    """
    q = query.strip().lower()
    exact = [n for n in names if n.lower() == q]
    if exact:
        return exact[0]
    hits = [n for n in names if q and q in n.lower()]
    if len(hits) == 1:
        return hits[0]
    listed = "; ".join(names) or "none"
    if not hits:
        raise UsageError(f"no platform {query!r} in the store (its platforms: {listed})", "pass one of them")
    raise UsageError(f"{query!r} names several platforms ({'; '.join(hits)})", "pass the full device name")


def parse_platforms(text: str) -> list[str]:
    """``"A,B"`` → ["A", "B"]; exactly two non-empty names (a `UsageError` otherwise)."""
    parts = [t.strip() for t in (text or "").split(",") if t.strip()]
    if len(parts) != 2:
        raise UsageError(
            f"--platforms takes two device names separated by a comma, got {text!r}",
            'e.g. --platforms "NVIDIA H200,NVIDIA H100 80GB HBM3" (or --platforms H200,H100)',
        )
    return parts


def roofs_for(platforms: list[str], peaks_df: pd.DataFrame | None) -> dict[str, Roof]:
    """Each platform's measured (from ``peaks_df``) and datasheet ceilings."""
    return {p: roof_of(p, peaks_df) for p in platforms}


def compare_platforms(
    agg: pd.DataFrame,
    platform_a: str,
    platform_b: str,
    samples: SamplesFn,
    peaks_df: pd.DataFrame | None = None,
    intensity: IntensityFn | None = None,
    n_resamples: int = N_RESAMPLES,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Speedups of platform A over platform B in one aggregated frame, with the roofline's prediction.

    Args:
        agg: aggregated configurations of both platforms (`frame.aggregate`).
        platform_a: A's exact platform name (`resolve_platform`).
        platform_b: B's.
        samples: pooled raw latencies of result ids (both platforms live in one store).
        peaks_df: measured ceilings (`roofline.storage.peaks_frame`), or None for datasheet peaks only.
        intensity: (model, resolution, batch, precision) → FLOP/byte; None: the eager-traffic estimate.
        n_resamples: bootstrap resamples per ratio.
        agg: the store's aggregated configurations of ``run_ids``, when the caller has them (the report's
            build does: aggregating again cost it seconds); default: aggregated here.

    Returns:
        (matched, best batch) as `analysis.compare.compare` returns them, plus
        `roofline.predict.PREDICT_COLUMNS`: ``predicted_ratio``, ``bound_a``/``bound_b``/``bound``,
        ``roofline_source`` (measured or datasheet, or why none), ``departs``.
    """
    a = agg[agg["platform"] == platform_a] if len(agg) else agg
    b = agg[agg["platform"] == platform_b] if len(agg) else agg
    matched, best = compare(a, b, samples, samples, n_resamples)
    roofs = roofs_for([platform_a, platform_b], peaks_df)
    return add_predictions(matched, roofs, intensity), add_predictions(best, roofs, intensity)


def gpu_platforms(agg: pd.DataFrame) -> list[str]:
    """Platforms whose rows ran on a CUDA device, in reverse name order (``NVIDIA H200`` before ``H100``)."""
    if agg.empty:
        return []
    gpu = agg[agg["device"].astype(str).str.startswith("cuda")]
    return sorted(gpu["platform"].astype(str).unique(), reverse=True)


def side_by_side(
    store_path: str | Store,
    platforms: list[str] | None = None,
    run_ids: list[str] | None = None,
    intensity: IntensityFn | None = None,
    n_resamples: int = N_RESAMPLES,
    agg: pd.DataFrame | None = None,
) -> dict[str, pd.DataFrame]:
    """What a report section sets side by side for the platforms of one store.

    Args:
        store_path: a deepgap store (typically merged from two machines), or an open `Store` (the report's).
        platforms: names or unique parts of names (`resolve_platform`); default every GPU platform.
        run_ids: only these runs.
        intensity: as in `compare_platforms`.
        n_resamples: bootstrap resamples per ratio.
        agg: the store's aggregated configurations of ``run_ids``, when the caller has them (the report's
            build does: aggregating again cost it seconds); default: aggregated here.

    Returns:
        ``ceilings``: per platform and ceiling, measured and datasheet values
        (`roofline.predict.ceilings_table`);
        ``best_batch`` and ``matched``: `compare_platforms` for every pair of the platforms (A the earlier in
        the given order; with the default order, H200 over H100), with energy per image of both sides
        (``joules_per_image_a``/``_b``); ``platforms``: the platforms used, one row each with its
        configurations count. Frames are empty (with their columns) when fewer than two platforms exist.
    """
    from deepgap.analysis.frame import aggregate, prepare
    from deepgap.analysis.samples import pooled_samples_fn
    from deepgap.roofline.storage import peaks_frame
    from deepgap.store import reading

    with reading(store_path) as store:
        if agg is None:
            agg = aggregate(prepare(store.results_frame(run_ids)), samples=store.samples)
        names = platform_names(agg)
        chosen = [resolve_platform(p, names) for p in platforms] if platforms else gpu_platforms(agg)
        peaks = peaks_frame(store)
        fn = pooled_samples_fn(store)
        matched, best = [], []
        runs = store.runs()
        notes: list[str] = []
        for pa, pb in combinations(chosen, 2):
            m, b = compare_platforms(agg, pa, pb, fn, peaks, intensity, n_resamples)
            matched.append(m)
            best.append(b)
            why = provenance(_runs_on(runs, agg, pa), _runs_on(runs, agg, pb))
            notes += [f"{pa} / {pb}: {n}" for n in why]
    counts: list[dict[str, Any]] = [
        {"platform": p, "configurations": int((agg["platform"] == p).sum())} for p in chosen
    ]
    return {
        "platforms": pd.DataFrame(counts, columns=["platform", "configurations"]),
        "ceilings": ceilings_table(roofs_for(chosen, peaks)),
        "best_batch": _concat(best),
        "matched": _concat(matched),
        "provenance": notes,  # `compare.provenance`: different code or sessions behind A and B
    }


def _runs_on(runs: list[dict[str, Any]], agg: pd.DataFrame, platform: str) -> list[dict[str, Any]]:
    """The stored runs behind one platform's configurations."""
    ids = {str(r) for ids in agg.loc[agg["platform"] == platform, "run_ids"] for r in ids}
    return [r for r in runs if str(r["run_id"]) in ids]


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
