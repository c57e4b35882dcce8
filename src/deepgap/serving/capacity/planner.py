"""Capacity from stored curves, without sending traffic — and how many devices carry a target load.

A *curve* is one configuration's batch → latency samples: a ``deepgap run`` sweep (``results``;
CUDA-event device time, so host→device copies are included only for ``--include-transfer`` runs) or a
serve run's calibration (``serve_curves``; the server's own end-to-end batch time). For each curve
`predict` searches batching policies in the simulator and returns the best capacity at the SLO.
`plan` answers the paper's T4-versus-L4 question at deployment scale: for each device kind (one or
more stores), the fewest devices that carry ``qps`` within the SLO — ⌈qps / capacity⌉ — and their
power, from the telemetry of the sweep at the policy's batch size (busy power: an upper bound at
any load up to capacity). A serve curve has no telemetry of its own: it takes the power of the sweep of
the same configuration (platform, model, engine, precision, format, resolution) and says so. Where a store
holds no power telemetry the power is "unavailable".

Every answer explains itself (`explain`): the capacity as a share of the saturation throughput, the
SLO's room for queueing after the median call, the batches measured and the samples the simulated tail
draws from (a sweep's 20–40 per batch: the simulation cannot see a tail beyond their maximum). Every
zero capacity says why, and every configuration considered for a platform is listed beside the chosen
one (``PlanRow.alternatives``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deepgap.core.precision import is_quantized
from deepgap.serving.capacity.grid_limit import grid_limit
from deepgap.serving.capacity.grid_limit import short as grid_limit_short
from deepgap.serving.capacity.search import CapacityResult, LoadSettings, candidate_policies, search_policies
from deepgap.serving.sim.simulator import ServiceModel

_KEY = (
    "platform",
    "model",
    "engine",
    "precision",
    "memory_format",
    "resolution",
    "threads",
    "include_transfer",
)


@dataclass
class Curve:
    """One configuration's service curve and what is known of its power."""

    key: dict[str, Any]
    service: ServiceModel
    source: str  # "sweep" | "serve"
    power_w: dict[int, float] = field(default_factory=dict)  # batch → mean power (telemetry)
    run_ids: list[str] = field(default_factory=list)
    accuracy: str = ""  # against fp32 (deepgap.analysis.frame.accuracy_label); shown if quantized
    power_source: str = ""  # where power_w came from when not this curve's own runs
    top1: float | None = (
        None  # dataset top-1 (median over its measurements) where measured (deepgap.measure.accuracy)
    )

    def label(self) -> str:
        """``resnet50 eager fp16 channels_last`` and the source (and a quantized curve's accuracy)."""
        k = self.key
        fmt = "" if k.get("memory_format") in (None, "nchw") else f" {k['memory_format']}"
        acc = f"; {self.accuracy}" if self.accuracy and is_quantized(k.get("precision")) else ""
        n = int(k.get("threads") or 0)  # CPU variants differ by their threads: name them
        thr = f" {n} thread{'s' if n != 1 else ''}" if n else ""
        return f"{k['model']} {k['engine']} {k['precision']}{fmt}{thr} ({self.source}{acc})"


@dataclass
class Prediction:
    """The best simulated capacity of one curve at an SLO."""

    curve: Curve
    best: CapacityResult
    ranked: list[CapacityResult]

    @property
    def power_batch(self) -> int | None:
        """The measured batch whose power stands for the policy's batch.

        The policy's batch, else the smallest measured one above it (power grows with the batch: an upper
        bound), else the largest measured.
        """
        if not self.curve.power_w:
            return None
        b = self.curve.service.bucket(self.best.policy.max_batch)
        above = [s for s in self.curve.power_w if s >= b]
        return min(above) if above else max(self.curve.power_w)

    @property
    def power_w(self) -> float | None:
        """Mean power at the batch size the best policy runs (None without telemetry)."""
        b = self.power_batch
        return None if b is None else self.curve.power_w[b]


def curves_from_store(store, run_ids: list[str] | None = None, padding: str = "bucket") -> list[Curve]:
    """Every curve of a store: sweeps (pooled over runs and sweeps of one configuration) and calibrations."""
    import pandas as pd

    from deepgap.analysis.flags import telemetry_of
    from deepgap.analysis.frame import ACCURACY_WORST, accuracy_label, is_default_input, prepare
    from deepgap.serving.records.storage import curves_frame

    out: list[Curve] = []
    df = store.results_frame(run_ids)
    if len(df):
        df = prepare(df)
        # a resident input (int8 images already in GPU memory, MLPerf-like) is no service a load is sent
        # to: its samples would pool with the default input's of the same key; planned from default rows
        ok = df[(df["status"] == "ok") & (~df["flagged"].astype(bool)) & is_default_input(df)]
        for key, g in ok.groupby(list(_KEY), sort=True, dropna=False):
            samples: dict[int, np.ndarray] = {}
            power: dict[int, list[float]] = {}
            for b, gb in g.groupby("batch_size"):
                arrs = [a for rid in gb["result_id"] for a in store.samples(int(rid))]
                if arrs:
                    samples[int(b)] = np.concatenate(arrs)
                pw = [telemetry_of(e).get("mean_power_w") for e in gb["extra"]]
                pw = [p for p in pw if p is not None]
                if pw:
                    power[int(b)] = pw
            if not samples:
                continue
            bs = sorted(samples)
            sv = ServiceModel(
                tuple(bs),
                tuple(float(np.median(samples[b])) for b in bs),
                samples,
                padding=padding,
                source="sweep",
            )
            worst = {c: (g[c].max() if how == "max" else g[c].min()) for c, how in ACCURACY_WORST.items()}
            # the agreement's n and weights, as the aggregate carries them: "(n not recorded)" only where
            # the store has none (analysis.accuracy)
            worst["top1_n"] = g["top1_n"].min() if "top1_n" in g else None
            worst["check_weights"] = ",".join(sorted({str(w) for w in g.get("check_weights", []) if w}))
            top1 = pd.to_numeric(g["top1"], errors="coerce").dropna() if "top1" in g else []
            out.append(
                Curve(
                    dict(zip(_KEY, key, strict=True)),
                    sv,
                    "sweep",
                    {b: float(np.median(v)) for b, v in power.items()},
                    sorted(set(g["run_id"])),
                    accuracy_label(worst),
                    top1=float(np.median(top1)) if len(top1) else None,
                )
            )
    cf = curves_frame(store, run_ids)
    if len(cf):
        for (run_id, _tenant), g in cf.groupby(["run_id", "tenant"], sort=True):
            if any(getattr(e, "workload", None) == "decode" for e in g["extra"]):
                continue  # a decoder's decode steps, not a batch curve of requests (`serving.run.llm_run`)
            first = g.iloc[0]
            bs = [int(b) for b in g["batch_size"]]
            sv = ServiceModel(
                tuple(bs),
                tuple(float(x) for x in g["latency_median_s"]),
                {int(b): s for b, s in zip(g["batch_size"], g["samples_s"], strict=True)},
                padding=padding,
                source="serve",
            )
            key = {
                "platform": first["device_name"] or first["device"],
                "model": first["model"],
                "engine": first["engine"],
                "precision": first["precision"],
                "memory_format": first["memory_format"],
                "resolution": int(first["resolution"]),
                "threads": 0,
                "include_transfer": True,
            }
            out.append(Curve(key, sv, "serve", {}, [run_id]))
    _borrow_sweep_power(out)
    return out


def _borrow_sweep_power(curves: list[Curve]) -> None:
    """Serve curves without power take that of the sweep of the same configuration (busy power per batch)."""
    same = ("platform", "model", "engine", "precision", "memory_format", "resolution")
    sweeps = {tuple(c.key[k] for k in same): c for c in curves if c.source == "sweep" and c.power_w}
    for c in curves:
        donor = sweeps.get(tuple(c.key[k] for k in same)) if c.source == "serve" and not c.power_w else None
        if donor is not None:
            c.power_w = dict(donor.power_w)
            c.power_source = f"power from the sweep of this configuration (runs {', '.join(donor.run_ids)})"


def _power_note(p: Prediction) -> str:
    if p.power_w is None:
        return "power unavailable: no telemetry in the store"
    b = p.curve.service.bucket(p.best.policy.max_batch)
    at = "" if p.power_batch == b else f"power at batch {p.power_batch} (not measured at {b})"
    return "; ".join(x for x in (p.curve.power_source, at) if x)


def predict(curve: Curve, load: LoadSettings, max_batch: int | None = None) -> Prediction:
    """The best batching policy of ``curve`` at ``load.slo_s`` and its simulated capacity."""
    caps = [b for b in curve.service.batch_sizes if max_batch is None or b <= max_batch]
    if curve.service.padding == "exact" and max_batch:
        caps = sorted(set(caps) | {min(max_batch, curve.service.max_batch)})
    pols = candidate_policies(curve.service, load.slo_s, caps, delay_fractions=(0.0, 0.05, 0.15, 0.3))
    if not pols:
        from deepgap.serving.sim.batcher import BatchPolicy

        sv = curve.service
        fastest = min(caps or sv.batch_sizes, key=sv.median_at)
        why = (
            f"no batch size is served within the SLO: the fastest call, batch {fastest}, takes "
            f"{sv.median_at(fastest) * 1e3:.3g} ms (median) ≥ {load.slo_s * 1e3:.3g} ms"
            if caps
            else f"no measured batch is ≤ --max-batch {max_batch}"
        )
        empty = CapacityResult(BatchPolicy(caps[0] if caps else 1, 0.0), load.slo_s, 0.0, None, note=why)
        return Prediction(curve, empty, [empty])
    ranked = search_policies(curve.service, load, pols, coarse_max_queries=4000)
    return Prediction(curve, ranked[0], ranked)


def explain(p: Prediction, unit: str = "q/s") -> str:
    """Why the capacity is what it is: share of saturation, the SLO's room for queueing, the samples.

    ``unit``: what a request per second is called (a text model's: seq/s).
    """
    sv, best = p.curve.service, p.best
    n = {b: len(sv.samples_s.get(b, ())) for b in sv.batch_sizes}
    lo, hi = (min(n.values()), max(n.values())) if n else (0, 0)
    samples = (
        f"service times drawn from {lo if lo == hi else f'{lo}–{hi}'} measured calls per batch"
        if n and max(n.values())
        else "service times: the medians only (no samples stored)"
    )
    batches = f"batches measured: {', '.join(str(b) for b in sv.batch_sizes)}"
    if limit := grid_limit(sv, best.slo_s):  # the grid, not the device, may be what limits it
        batches += f" ({limit})"
    if best.capacity_qps <= 0:
        return "; ".join(x for x in (best.note or "no rate passed", batches, samples) if x)
    b = sv.bucket(best.policy.max_batch)
    sat = sv.saturation_qps(best.policy.max_batch)
    room = best.slo_s - sv.median_at(b)
    return (
        f"{100 * best.capacity_qps / sat:.0f}% of the saturation throughput "
        f"({sat:,.4g} {unit} at batch ≤ {b}): "
        f"the median call ({sv.median_at(b) * 1e3:.3g} ms) leaves {room * 1e3:.3g} ms of the SLO for "
        f"queueing and batching; {batches}; {samples}"
    )


@dataclass
class PlanRow:
    """How one device kind carries the target load."""

    platform: str
    configuration: str
    policy: str
    capacity_qps: float
    devices: int | None
    power_w_per_device: float | None
    total_power_w: float | None
    note: str = ""
    relative_devices: float | None = None  # devices / the first-ranked platform's devices
    relative_power: float | None = None  # total power / the first-ranked platform's total power
    top1: float | None = None  # dataset top-1 of the configuration, where measured
    capacity_used: str = "deepgap's: simulated by its event loop on the measured curve (LoadGen's: not used)"
    devices_high: int | None = (
        None  # devices if the cards bought are 2 SD slow (a store with 2+ cards of the type)
    )
    why: str = ""  # `explain`: what limits the capacity
    alternatives: list[dict[str, Any]] = field(default_factory=list)  # every other configuration considered


def store_card_spreads(paths: list[str]) -> dict[str, Any]:
    """Per platform, the card-to-card `deepgap.analysis.cards.Spread` of the measurements in ``paths``."""
    from deepgap.analysis.cards import platform_spread
    from deepgap.analysis.frame import prepare
    from deepgap.store import Store

    frames = []
    for path in paths:
        st = Store(path, readonly=True)
        try:
            frames.append(st.results_frame())
        finally:
            st.close()
    import pandas as pd

    return platform_spread(prepare(pd.concat(frames, ignore_index=True))) if frames else {}


def widen_by_cards(rows: list[PlanRow], spreads: dict[str, Any], qps: float) -> list[PlanRow]:
    """Rows with ``devices_high``: the devices needed if each card runs 1.96 card-to-card SDs slow.

    Why: a capacity measured on one card is that card's; the next card of the type may be slower
    (`deepgap.analysis.cards`). Without a spread (a store with one card of the type) nothing changes.
    """
    from deepgap.analysis.cards import Z95

    for r in rows:
        sp = spreads.get(r.platform)
        if sp is None or r.devices is None or not r.capacity_qps > 0:
            continue
        slow = r.capacity_qps * max(1e-6, 1.0 - Z95 * sp.rel_sd)
        r.devices_high = math.ceil(qps / slow)
        r.note = "; ".join(x for x in (r.note, f"{sp.text()}: up to {r.devices_high} devices") if x)
    return rows


def plan(
    predictions: list[Prediction], qps: float, objective: str = "devices", unit: str = "q/s"
) -> list[PlanRow]:
    """Per platform, the configuration that best meets ``objective`` (devices or watts), best platform first.

    ``unit``: what a request per second is called in each row's explanation (a text model's: seq/s).
    """
    by_platform: dict[str, list[PlanRow]] = {}
    for p in predictions:
        cap = p.best.capacity_qps
        n = math.ceil(qps / cap) if cap > 0 else None
        pw = p.power_w
        row = PlanRow(
            platform=str(p.curve.key["platform"]),
            configuration=p.curve.label(),
            policy=p.best.policy.label(),
            capacity_qps=cap,
            devices=n,
            power_w_per_device=pw,
            total_power_w=n * pw if n is not None and pw is not None else None,
            note="; ".join(
                x
                for x in (
                    p.best.note,
                    _power_note(p),
                    grid_limit_short(grid_limit(p.curve.service, p.best.slo_s)),
                )
                if x
            ),
            top1=p.curve.top1,
            why=explain(p, unit),
        )
        by_platform.setdefault(row.platform, []).append(row)

    def rank(r: PlanRow) -> tuple[float, float]:
        dev = float(r.devices) if r.devices is not None else math.inf
        watts = r.total_power_w if r.total_power_w is not None else math.inf
        return (watts, dev) if objective == "watts" else (dev, watts)

    best = []
    for rows in by_platform.values():
        ranked = sorted(rows, key=rank)
        ranked[0].alternatives = [
            {
                "configuration": r.configuration,
                "policy": r.policy,
                "capacity_qps": r.capacity_qps,
                "devices": r.devices,
                "total_power_w": r.total_power_w,
                "why": r.why,
            }
            for r in ranked[1:]
        ]
        best.append(ranked[0])
    best.sort(key=rank)
    if best:  # how each platform compares with the first: "2.0× the devices, 1.4× the watts"
        first = best[0]
        for r in best:
            if r.devices is not None and first.devices:
                r.relative_devices = r.devices / first.devices
            if r.total_power_w is not None and first.total_power_w:
                r.relative_power = r.total_power_w / first.total_power_w
    return best
