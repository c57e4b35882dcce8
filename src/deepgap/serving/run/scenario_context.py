"""What a scenario's driver reads and writes: the spec, the worker, the calibrated service, the record.

Why its own module: the single-stream and offline drivers (`deepgap.serving.run.scenarios`) and the server
driver with its capacity search (`deepgap.serving.run.server_scenario`) share it, and LoadGen's run reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deepgap.serving.records.storage import ServeRecord
from deepgap.serving.run.process import ServingWorker, SetupRequest
from deepgap.serving.run.rows import (
    Say,
    ServeOutcome,
)
from deepgap.serving.run.spec import ServeSpec
from deepgap.serving.sim.log import LevelSummary
from deepgap.serving.sim.simulator import ServiceModel


def level_timeout(n: int, rate: float | None) -> float:
    """Seconds a level of ``n`` queries at ``rate`` may take in the worker before it counts as hung."""
    return 120.0 + (4.0 * n / rate if rate else 600.0)


@dataclass
class ScenarioContext:
    """One scenario's run: its spec and request, the worker, the calibrated service model, the record."""

    spec: ServeSpec
    req: SetupRequest
    worker: ServingWorker
    service: ServiceModel
    rec: ServeRecord
    out: ServeOutcome
    say: Say
    trace: np.ndarray | None
    parts: dict[int, dict[str, float]] = field(default_factory=dict)  # calibration parts per batch size


def engine_ips(c: ScenarioContext) -> tuple[float, int] | None:
    """(img/s, batch) of the engine alone at its best calibrated batch: the sweep's offline number."""
    rates = [(b / p["engine_s"], b) for b, p in c.parts.items() if p.get("engine_s")]
    return max(rates) if rates else None


def engine_details(c: ScenarioContext) -> dict[str, Any]:
    """`CapacityDetails`' engine fields of this run (none where the calibration timed no engine alone).

    Why on each capacity row: "capacity / the engine alone" is a goal a store must show (``show``, ``export``),
    not only the console's line of the run.
    """
    engine = engine_ips(c)
    if engine is None:
        return {}
    rate, b = engine
    burst = c.parts.get(b, {}).get("engine_burst_s")
    return {
        "engine_ips": rate,
        "engine_batch": b,
        "engine_held_s": c.req.engine_min_time_s,
        "engine_burst_ips": b / burst if burst else None,
    }


def engine_words(c: ScenarioContext) -> str:
    """How the run's engine-alone rate (`engine_details`) was measured, with its short burst where it was held.

    Why: the ratio of a served capacity to "the engine alone" names both sides; a burst of a few batches
    runs at boost clocks, a window held ≥ 1 s at the clocks sustained load leaves (`server.sustained_s`).
    """
    d = engine_details(c)
    words = f"{d['engine_ips']:,.1f} {rate_unit(c)} at batch {d['engine_batch']}, device-resident inputs"
    if d["engine_held_s"] > 0 and d["engine_burst_ips"]:
        words += (
            f", held ≥ {d['engine_held_s']:g} s back to back; a short burst: {d['engine_burst_ips']:,.1f}"
        )
    return words


def rate_unit(c: ScenarioContext) -> str:
    """What one request is per second: an image, or a text model's sequence.

    A text model's engine-alone rate is measured at its longest calibrated length, which the unit names.
    """
    return f"seq/s at length {c.req.resolution}" if getattr(c.req, "seq_lens", ()) else "img/s"


def host_line(log_summary: LevelSummary) -> str:
    """Where a batch's time goes: host issue time beside the device's copy-in, compute and copy-out."""
    s = log_summary
    return (
        f"per batch: host {s.host_mean_s * 1e3:.3f} ms, h2d {s.h2d_mean_s * 1e3:.3f} ms, compute "
        f"{s.compute_mean_s * 1e3:.3f} ms, d2h {s.d2h_mean_s * 1e3:.3f} ms "
        f"(mean batch {s.mean_batch:.1f})"
    )
