"""Served levels and capacities as ``deepgap export`` writes them (a decoder's levels: `llm_tables.llm_export`).

Why: a store holding only ``deepgap serve`` runs exported 0 rows, so its levels and capacities reached a CSV
only through the report's files. Each level keeps its raw percentiles beside its tail named by its n
(`tables.add_tails`: a p99 only where n ≥ 368, else the max of n), and each capacity its simulator's figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepgap.serving.show import tables
from deepgap.serving.show.llm_tables import without_llm

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.store import Store

LEVELS = [
    "run_id", "platform", "model", "engine", "precision", "memory_format", "resolution", "tenant", "scenario",
    "purpose", "phase", "max_batch", "max_delay_s", "target_qps", "status", "reason", "n", "n_planned",
    "duration_s", "achieved_qps", "latency_mean_s", "latency_p50_s", "latency_p90_s", "latency_p95_s",
    "latency_p99_s", "latency_max_s", "latency_tail_s", "latency_tail_kind", "queue_mean_s", "h2d_mean_s",
    "compute_mean_s", "d2h_mean_s", "other_mean_s", "mean_batch", "slo_s", "n_over_slo", "verdict", "stopped",
    "predicted_qps", "predicted_p99_s", "seq_len_dist", "padding", "useful_tokens_per_s", "padded_tokens_per_s",
    "padding_fraction", "predicted_useful_tokens_per_s",
]  # fmt: skip
# a capacity's ``kv_cache`` ("fp8", else "") only where some served decoder's cache held fp8 codes, and its
# ``admissions`` (exported as ``serve_prefill``, as a decoder's levels) only where some decoder's set-up said;
# the run's engine alone and the capacity's ratio to it on every row (NaN on stores before session 46)
CAPACITIES = [
    "run_id", "platform", "model", "engine", "admissions", "precision", "kv_cache", "memory_format", "resolution",
    "tenant", "source", "slo_s", "percentile", "confidence", "max_batch", "max_delay_s", "capacity_qps", "upper_qps",
    "predicted_qps", "measured_over_predicted", "n_probes", "note", "engine_ips", "engine_batch", "engine_held_s",
    "engine_burst_ips", "capacity_over_engine",
]  # fmt: skip


def serve_export(store: Store, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Levels (``workload`` "serve") then capacities ("serve-capacity") of image and text servers; empty if none."""
    import pandas as pd

    if not tables.any_serving(store):
        return pd.DataFrame()
    lv = without_llm(tables.levels(store, run_ids))
    cp = tables.capacity(store, run_ids)
    parts = []
    if len(lv):
        parts.append(lv[[c for c in LEVELS if c in lv]].assign(workload="serve"))
    if len(cp):
        tokens = [getattr(e, "output_tokens_per_s", None) for e in cp["extra"]]  # a decoder's capacity
        parts.append(
            cp[[c for c in CAPACITIES if c in cp]]
            .rename(columns={"admissions": "serve_prefill"})
            .assign(workload="serve-capacity", output_tokens_per_s=tokens)
        )
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    return out[["workload", *[c for c in out.columns if c != "workload"]]]
