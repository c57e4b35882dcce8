"""Serving results as tables (pandas), shared by ``deepgap show`` and the HTML report.

Only reading and arranging: every number comes from the store's serving tables.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from deepgap.core.records import kv_cache_suffix
from deepgap.serving.records.details import engine_ratio_note
from deepgap.serving.records.storage import capacity_frame, has_tables, levels_frame

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.store import Store


def policy_label(max_batch, max_delay_s) -> str:
    """``16 / 2ms`` (or '' for closed-loop runs without a policy)."""
    if max_batch is None or max_batch != max_batch:
        return ""
    return f"{int(max_batch)} / {float(max_delay_s) * 1e3:g}ms"


def add_tails(df: pd.DataFrame) -> None:
    """A level's latency tail, named: its p99 where its n requests support one, else its max (`analysis.tails`).

    Why: a capacity probe that stops early can end on a few hundred requests, and a p99 of 348 is the
    sample's top values interpolated: views show ``latency_tail_s`` with ``latency_tail_kind`` and n, and the
    simulator's p99 only where ``p99_supported``. The rule is a forward measurement's (`tails.of_measurement`).
    """
    from deepgap.analysis.tails import of_measurement

    t = [
        of_measurement({"n_samples": n, "latency_p99_s": p, "latency_max_s": m})
        for n, p, m in zip(df["n"], df["latency_p99_s"], df["latency_max_s"], strict=True)
    ]
    df["latency_tail_s"] = [x.seconds for x in t]
    df["latency_tail_kind"] = [x.kind for x in t]
    df["p99_supported"] = df["latency_tail_kind"] == "p99"


def tail_text(r: dict, digits: int = 3) -> str:
    """``25.210 (max of n=348)`` or ``6.128 (p99 of n=4191)`` (`analysis.tails.Tail.name`); blank if unmeasured."""
    from deepgap.analysis.tails import Tail

    v, n = r.get("latency_tail_s"), r.get("n")
    if v is None or v != v or n is None or n != n or not r.get("latency_tail_kind"):
        return ""
    return f"{float(v) * 1e3:.{digits}f} ({Tail(float(v), r['latency_tail_kind'], int(n)).name()})"


SERVED_SIGMAS = 3.0  # how far above its offered rate a level's served rate may lie before it is marked
SERVED_MARK = " (> offered)"
SERVED_NOTE = (
    "served = n ÷ (first arrival → last result): within the Poisson noise of n arrivals (about 1/√n) it may "
    f"exceed the offered rate; '{SERVED_MARK.strip()}' marks a level above it by more than {SERVED_SIGMAS:g}/√n"
)


def served_above_offered(served: float | None, offered: float | None, n: float | None) -> bool:
    """Whether a level served faster than it was offered by more than the Poisson noise of its n arrivals.

    Why: a short probe's served rate can exceed its offered one and be true: its n arrivals span n − 1 gaps
    (a relative spread of 1/√(n − 1) about (n − 1)/rate) and its last results come back soon after. Beyond
    ``SERVED_SIGMAS`` of that spread (and the n/(n − 1) of counting n requests over n − 1 gaps) it is no
    longer that noise, and is marked, never shown plainly.
    """
    try:
        s, o, k = float(served), float(offered), float(n)  # None or pd.NA: nothing to judge
    except (TypeError, ValueError):
        return False
    if not (o > 0 and k >= 2):  # NaN fails both
        return False
    return s > o * k / (k - 1) * (1 + SERVED_SIGMAS / math.sqrt(k - 1))


def served_cell(r: dict, fmt, offered: str = "target_qps") -> str:
    """A level's served rate as ``fmt`` writes it, with `SERVED_MARK` where `served_above_offered`."""
    mark = served_above_offered(r.get("achieved_qps"), r.get(offered), r.get("n"))
    return fmt(r.get("achieved_qps")) + (SERVED_MARK if mark else "")


def add_kv_cache(df: pd.DataFrame) -> None:
    """A ``kv_cache`` column ("fp8", else "") from each row's details, where any row's cache is not its own dtype.

    Why only then: the column is a served decoder's fp8 cache (``--kv-cache``); a store without one keeps the
    frames, and so the report's tables and ``export``, it always had.
    """
    _add_detail(df, "kv_cache")


def add_admissions(df: pd.DataFrame) -> None:
    """An ``admissions`` column (a served decoder's prefill words, else "") where any capacity row has them.

    Read by `llm_tables.engine_cell`: compiled or eager admissions part a decoder's capacity by half at 8B.
    """
    _add_detail(df, "admissions")


def _add_detail(df: pd.DataFrame, key: str) -> None:
    """Column ``key`` from each row's details (its value, else ""), only where some row has one."""
    values = [(getattr(e, key, None) or "") for e in df["extra"]] if "extra" in df else []
    if any(values):
        df[key] = values


def precision_cell(r: dict) -> str:
    """A row's precision, with ``· fp8 KV cache`` where its decoder's cache held fp8 codes (`kv_cache_label`).

    Why in the precision's cell: a served run with fp8 codes must never read like one with the decoder's own
    cache, and a column of its own would be empty on every store served without the option.
    """
    return f"{r['precision']}{kv_cache_suffix(r.get('kv_cache'), ' · ')}"


def sim_p99(r: dict) -> float | None:
    """The simulator's p99 of a level where its n supports a p99 (the measured side's), else None."""
    return r.get("predicted_p99_s") if r.get("p99_supported") else None


def levels(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """One row per measured level with the simulator's prediction and the measured/predicted ratios."""
    df = levels_frame(store, run_ids)
    if df.empty:
        return df
    import pandas as pd

    df["mean_batch"] = pd.to_numeric(
        df["mean_batch"], errors="coerce"
    )  # TEXT in stores written before 2026-11-23
    df["platform"] = [n or d for n, d in zip(df["device_name"], df["device"], strict=True)]
    df["policy"] = [policy_label(b, d) for b, d in zip(df["max_batch"], df["max_delay_s"], strict=True)]
    add_kv_cache(df)
    add_tails(df)
    with np.errstate(divide="ignore", invalid="ignore"):  # a p99 ratio only where n supports both p99s
        df["p99_measured_over_predicted"] = df["latency_p99_s"] / df["predicted_p99_s"].where(
            df["p99_supported"]
        )
        df["qps_measured_over_predicted"] = df["achieved_qps"] / df["predicted_qps"]
    df["served_above_offered"] = [
        served_above_offered(a, o, n)
        for a, o, n in zip(df["achieved_qps"], df["target_qps"], df["n"], strict=True)
    ]
    for col in TEXT_COLUMNS:  # a text model's level (`LevelDetails`); NaN for images
        df[col] = [getattr(d, col, None) if d is not None else None for d in df["extra"]]
        if col not in ("seq_len_dist", "padding"):
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


TEXT_COLUMNS = (
    "seq_len_dist",
    "padding",
    "useful_tokens_per_s",
    "padded_tokens_per_s",
    "padding_fraction",
    "predicted_useful_tokens_per_s",
)


def text_levels(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """The levels of text models: seq/s beside useful and padded tokens/s (empty when there are none)."""
    df = levels(store, run_ids)
    if df.empty:
        return df
    return df[df["useful_tokens_per_s"].notna()]


def capacity(store: Store, run_ids: list[str] | None = None, top_simulated: int = 3) -> pd.DataFrame:
    """Measured capacities beside the simulator's for the same policy, then the best simulated policies."""
    import pandas as pd

    cf = capacity_frame(store, run_ids)
    if cf.empty:
        return cf
    cf["platform"] = [n or d for n, d in zip(cf["device_name"], cf["device"], strict=True)]
    cf["policy"] = [policy_label(b, d) for b, d in zip(cf["max_batch"], cf["max_delay_s"], strict=True)]
    add_kv_cache(cf)
    add_admissions(cf)
    for key in ENGINE_COLUMNS:  # the run's engine alone (`CapacityDetails`; NaN on stores before session 46)
        cf[key] = pd.to_numeric([getattr(e, key, None) for e in cf["extra"]], errors="coerce")
    cf["engine_batch"] = cf["engine_batch"].astype("Int64")  # a batch, not 128.0
    with np.errstate(divide="ignore", invalid="ignore"):
        cf["measured_over_predicted"] = np.where(
            cf["source"] == "measured", cf["capacity_qps"] / cf["predicted_qps"], np.nan
        )
        cf["capacity_over_engine"] = cf["capacity_qps"] / cf["engine_ips"]
    measured = cf[cf["source"] == "measured"]
    sim = cf[cf["source"] != "measured"].sort_values("capacity_qps", ascending=False)
    sim = sim.groupby(["run_id", "tenant"], sort=False).head(top_simulated)
    return pd.concat([measured, sim], ignore_index=True)


ENGINE_COLUMNS = ("engine_ips", "engine_batch", "engine_held_s", "engine_burst_ips")


def engine_ratio_cell(r: dict) -> str:
    """A capacity's ratio to the run's engine alone, naming that side: ``0.951 of 51,390 (bs128, held 1 s)``.

    Why both sides: the ratio is a goal (issue 47: ≥ 0.95), and an engine alone timed over a short burst runs
    at boost clocks, one held 1 s at the clocks sustained load leaves (`server.sustained_s`).
    """
    ratio, rate = r.get("capacity_over_engine"), r.get("engine_ips")
    if ratio is None or ratio != ratio or not rate:
        return "–"
    held = r.get("engine_held_s") or 0.0
    how = f"held {held:g} s" if held > 0 else "a short burst"
    return f"{ratio:.3f} of {rate:,.0f} (bs{int(r['engine_batch'])}, {how}){engine_ratio_note(ratio)}"


def interference(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Tenant × phase: p99, served rate, and p99 relative to the tenant alone (one row per tenant and phase)."""
    import pandas as pd

    df = levels(store, run_ids)
    if df.empty:
        return df
    t = df[(df["purpose"] == "tenant") & (df["status"] == "ok")]
    if t.empty:
        return pd.DataFrame()
    rows = []
    for (run_id, tenant), g in t.groupby(["run_id", "tenant"], sort=False):
        alone = g[g["phase"] == tenant]
        # a p99 ratio needs a p99 on both sides (n ≥ P99_MIN_N each), else it is left out (NaN)
        a_p99 = (
            float(alone["latency_p99_s"].iloc[0]) if len(alone) and alone["p99_supported"].iloc[0] else np.nan
        )
        a_qps = float(alone["achieved_qps"].iloc[0]) if len(alone) else np.nan
        for r in g.to_dict("records"):
            rows.append(
                {
                    "run_id": run_id,
                    "platform": r["platform"],
                    "tenant": tenant,
                    "phase": "alone" if r["phase"] == tenant else r["phase"],
                    "offered_qps": r["target_qps"],
                    "achieved_qps": r["achieved_qps"],
                    "latency_p99_s": r["latency_p99_s"],
                    "n": r["n"],
                    "latency_tail_s": r["latency_tail_s"],
                    "latency_tail_kind": r["latency_tail_kind"],
                    "p99_over_alone": r["latency_p99_s"] / a_p99
                    if a_p99 == a_p99 and r["p99_supported"]
                    else np.nan,
                    "qps_over_alone": r["achieved_qps"] / a_qps if a_qps == a_qps else np.nan,
                    "predicted_p99_alone_s": r["predicted_p99_s"],
                }
            )
    return pd.DataFrame(rows)


def interference_matrix(df: pd.DataFrame, value: str = "p99_over_alone") -> pd.DataFrame:
    """Pivot of `interference`: tenants as rows, phases as columns."""
    if df.empty:
        return df
    order = list(dict.fromkeys(df["phase"]))
    m = df.pivot_table(index="tenant", columns="phase", values=value, aggfunc="first", sort=False)
    return m[[c for c in order if c in m.columns]]


def any_serving(store: Store) -> bool:
    """Whether the store has serving data at all."""
    return has_tables(store)


def stopped_runs(store: Store, run_ids: list[str] | None = None) -> list[str]:
    """The serve runs (of ``run_ids``, or all) that a stop ended: their levels are those finished before it.

    Why named: such a run's probes read like any search's, but the search did not end, so the run holds no
    capacity; a reader must not take its highest passing probe for one.
    """
    return [
        str(r["run_id"])
        for r in store.runs()
        if r.get("kind") == "serve"
        and r.get("status") == "interrupted"
        and (run_ids is None or r["run_id"] in run_ids)
    ]
