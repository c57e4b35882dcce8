"""Cross-check deepgap's energy figures against an independent read of the NVML energy counter.

What it does, in one run:

1. This (parent) process opens NVML itself and polls every GPU's total-energy counter every ~2 ms
   (and its power reading every ~50 ms) on a thread, with epoch timestamps: the *independent trace*.
2. Meanwhile ``deepgap.api.run`` measures a small sweep (ResNet-50 by default) in its worker process,
   with telemetry on; every configuration stores the counter readings that bracket each energy
   window (``extra["telemetry"]["marks"]``: epoch times t0/t1, the idle tail after each window).
3. For every configuration it compares deepgap's stored ``energy_j`` with the energy the independent
   trace shows between the same instants, C(t1) − C(t0), and with the sampled power integrated over
   the windows (a different signal: the driver's averaged power). It also estimates the counter's
   update period from the trace.

Pass: every configuration's |deepgap / independent − 1| ≤ ``--tolerance`` (5%). Exit codes: 0 pass,
1 fail, 2 unavailable (no NVML / no GPU). Output: a table on stdout and ``--out`` (JSON).

Run on a GPU machine::

    python benchmarks/energy_check.py --out energy_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

import numpy as np


class Trace:
    """Polls every NVML device's energy counter (and power) on a thread."""

    def __init__(self, nvml, period_s: float = 0.002, power_every: int = 25) -> None:
        self.nv = nvml
        self.period_s = period_s
        self.power_every = power_every
        self.handles = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(h)
            self.handles[uuid.decode() if isinstance(uuid, bytes) else str(uuid)] = h
        self.energy = {u: [] for u in self.handles}  # (t epoch, joules)
        self.power = {u: [] for u in self.handles}  # (t epoch, watts)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            for u, h in self.handles.items():
                try:
                    mj = self.nv.nvmlDeviceGetTotalEnergyConsumption(h)
                    self.energy[u].append((time.time(), mj * 1e-3))
                    if n % self.power_every == 0:
                        self.power[u].append((time.time(), self.nv.nvmlDeviceGetPowerUsage(h) * 1e-3))
                except self.nv.NVMLError:
                    pass
            n += 1
            time.sleep(self.period_s)

    def __enter__(self) -> Trace:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def at(self, uuid: str, t: float) -> float:
        """Counter value a read at epoch time t would have returned (the last reading at or before t)."""
        arr = np.asarray(self.energy[uuid])
        i = int(np.searchsorted(arr[:, 0], t, side="right")) - 1
        return float(arr[max(i, 0), 1])

    def update_period_s(self, uuid: str) -> float | None:
        """Median time between counter changes."""
        arr = np.asarray(self.energy[uuid])
        if len(arr) < 3:
            return None
        changes = arr[1:, 0][np.diff(arr[:, 1]) != 0]
        return float(np.median(np.diff(changes))) if len(changes) > 2 else None

    def power_integral_j(self, uuid: str, t0: float, t1: float) -> float | None:
        """Trapezoid of the sampled power between t0 and t1."""
        arr = np.asarray(self.power[uuid])
        if len(arr) < 2:
            return None
        ts = np.linspace(t0, t1, 200)
        trapezoid = getattr(np, "trapezoid", None) or np.trapz
        return float(trapezoid(np.interp(ts, arr[:, 0], arr[:, 1]), ts))


class _WallClockNvml:
    """--selftest: a 100 W device whose counter is wall-clock time × 100 W, like ``fake:steady``."""

    class NVMLError(Exception):  # noqa: N818
        pass

    def nvmlDeviceGetCount(self):  # noqa: N802, D102
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802, D102
        return i

    def nvmlDeviceGetUUID(self, h):  # noqa: N802, D102
        return "GPU-fake"

    def nvmlDeviceGetTotalEnergyConsumption(self, h):  # noqa: N802, D102
        return int(time.time() * 100.0 * 1e3)

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802, D102
        return 100_000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--precisions", default="fp16,fp32")
    p.add_argument("--batch-sizes", default="8,64")
    p.add_argument("--energy-window", type=float, default=3.0, help="seconds per energy window")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--store", default=None, help="store path (default: a temporary file)")
    p.add_argument("--out", default="energy_check.json")
    p.add_argument(
        "--selftest",
        action="store_true",
        help="CPU-only check of this script: tinycnn on the CPU with the fake 100 W telemetry",
    )
    a = p.parse_args()

    if a.selftest:
        nvml = _WallClockNvml()
    else:
        try:
            import pynvml as nvml

            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001
            print(f"unavailable: NVML cannot start ({exc})")
            return 2
    from deepgap import api
    from deepgap.core.result_details import TelemetryDetails
    from deepgap.drive.config import SweepSpec, parse_int_list, parse_str_list

    spec = SweepSpec(
        models=(a.model,),
        precisions=parse_str_list(a.precisions),
        batch_sizes=parse_int_list(a.batch_sizes, "b"),
        device=a.device,
        warmup=20,
        iterations=30,
        repeats=a.repeats,
        target_ci=None,
        energy_window_s=a.energy_window,
        sample_hz=20.0,
        idle_s=3.0,
    )
    if a.selftest:
        spec = spec.replace(
            models=("tinycnn",),
            precisions=("fp32",),
            device="cpu",
            threads=(1,),
            warmup=2,
            iterations=5,
            repeats=2,
            energy_window_s=0.5,
            idle_s=0.5,
            options={"telemetry_backend": "fake:steady"},
        )
    store = a.store or os.path.join(tempfile.mkdtemp(prefix="deepgap-energy-"), "store.sqlite")
    t_start = time.time()
    with Trace(nvml) as trace:
        res = api.run(spec, store=store, log=lambda m: print(f"  {m}"))
        time.sleep(0.3)  # let the trace pass the last window's end
    df = res.to_pandas()
    rows, ok_all = [], True
    for r in df.to_dict("records"):
        tel = r["extra"].telemetry or TelemetryDetails()
        label = f"{r['model']} {r['precision']} bs{r['batch_size']}"
        uuid = (tel.settings or {}).get("uuid")
        if r["status"] != "ok" or tel.energy_source != "counter" or uuid not in trace.energy:
            rows.append(
                {
                    "config": label,
                    "status": r["status"],
                    "reason": r["reason"] or tel.energy_source or tel.status,
                    "pass": False,
                }
            )
            ok_all = False
            continue
        marks = tel.marks
        indep_j = sum(trace.at(uuid, m["t1_s"]) - trace.at(uuid, m["t0_s"]) for m in marks)
        raw_j = sum(m["e1_j"] - m["e0_j"] for m in marks)
        tail_j = tel.energy_tail_j or 0.0
        # the independent figure gets the same idle-tail correction deepgap applies (it is tiny)
        indep_corr_j = indep_j - tail_j
        pint = [trace.power_integral_j(uuid, m["t0_s"], m["t1_s"] - m["tail_s"]) for m in marks]
        power_j = sum(pint) if all(x is not None for x in pint) else None
        ratio = tel.energy_j / indep_corr_j if indep_corr_j > 0 else float("nan")
        ok = abs(ratio - 1) <= a.tolerance
        ok_all &= ok
        rows.append(
            {
                "config": label,
                "status": "ok",
                "windows": len(marks),
                "window_s": tel.energy_window_s,
                "deepgap_energy_j": tel.energy_j,
                "deepgap_raw_counter_j": raw_j,
                "tail_j": tail_j,
                "independent_counter_j": indep_corr_j,
                "ratio": ratio,
                "power_integral_j": power_j,
                "power_integral_ratio": (tel.energy_j / power_j) if power_j else None,
                "mean_power_w": tel.mean_power_w,
                "power_from_energy_w": tel.power_from_energy_w,
                "joules_per_image": tel.joules_per_image,
                "ips_per_watt": tel.ips_per_watt,
                "ips_per_watt_energy": tel.ips_per_watt_energy,
                "idle_power_w": tel.idle_power_w,
                "flags": r["extra"].flags or [],
                "pass": ok,
            }
        )
    tels = [r_["extra"].telemetry or TelemetryDetails() for r_ in df.to_dict("records")]
    uuids = {(t.settings or {}).get("uuid") for t in tels}
    periods = {u: trace.update_period_s(u) for u in uuids if u in trace.energy}
    report = {
        "pass": ok_all,
        "tolerance": a.tolerance,
        "store": store,
        "run_id": res.run_id,
        "elapsed_s": time.time() - t_start,
        "counter_update_period_s": periods,
        "trace_reads": {u: len(v) for u, v in trace.energy.items()},
        "configs": rows,
    }
    with open(a.out, "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    print(
        "\ncounter update period (median between changes): "
        + ", ".join(f"{u[:12]}… {p * 1e3:.1f} ms" if p else f"{u[:12]}… unknown" for u, p in periods.items())
    )
    print(
        f"{'configuration':28} {'deepgap J':>10} {'indep. J':>10} {'ratio':>7} {'P·dt J':>10} {'W(mean)':>8} "
        f"{'W(E/t)':>8} {'mJ/img':>8} {'img/s/W':>8} {'pass':>5}"
    )
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['config']:28} {r['status']}: {r['reason']}")
            continue
        print(
            f"{r['config']:28} {r['deepgap_energy_j']:10.1f} {r['independent_counter_j']:10.1f} {r['ratio']:7.4f} "
            f"{(r['power_integral_j'] or float('nan')):10.1f} {(r['mean_power_w'] or float('nan')):8.1f} "
            f"{r['power_from_energy_w']:8.1f} {r['joules_per_image'] * 1e3:8.2f} "
            f"{(r['ips_per_watt_energy'] or float('nan')):8.2f} {str(r['pass']):>5}  {' '.join(r['flags'])}"
        )
    print(
        f"\n{'PASS' if ok_all else 'FAIL'}: deepgap energy within {a.tolerance:.0%} of the independent counter read"
        f" — details in {a.out}"
    )
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
