"""A platform is a host and its device: CPUs of different hosts stay apart, even under one name.

Why: a merged store of an H200 VM and an H100 VM holds two host CPUs that report the same generic name
("Intel(R) Xeon(R) Processor") and the same host name ("vm"). Named by device alone they were one
platform: their measurements pooled, and each GPU's "× host CPU" was over the pool (133× became 147×).
A CPU row's host is told by its host name and the GPU its run measured beside it (the host-CPU part of a
GPU run, docs/cpu-baseline.md); where one CPU name covers two or more such hosts, each gets its own
platform name: ``Intel(R) Xeon(R) Processor (host of NVIDIA H200)``, ``… (host of NVIDIA H100 80GB
HBM3)``, or ``… (host vm-2)`` for a CPU-only run. A CPU name with one host keeps its plain name.
"""

from __future__ import annotations

import pandas as pd


def _host_label(host: str, gpu: str, hosts: set[str], gpus: list[str]) -> str:
    """What tells one host from the others of its CPU name: its GPU, its host name, or both."""
    if gpu and gpus.count(gpu) == 1:
        return f"host of {gpu}"
    if gpu:
        return f"host {host} of {gpu}" if len(hosts) > 1 else f"host of {gpu}"
    return f"host {host}" if host else "host not recorded"


def split_cpu_hosts(df: pd.DataFrame) -> list[str]:
    """Each row's platform: ``platform`` as it is, a CPU's qualified by its host where its name is shared.

    ``df``: a results frame with ``platform``, ``device``, ``run_id`` and ``host`` (missing ones: as is).
    """
    names = [str(p) for p in df["platform"]]
    if df.empty or not {"device", "run_id", "host"} <= set(df.columns):
        return names
    is_cpu = [str(d) == "cpu" for d in df["device"]]
    gpu_of_run: dict[str, str] = {}
    for run, dev, name in zip(df["run_id"], df["device"], df["platform"], strict=True):
        if str(dev) != "cpu":
            gpu_of_run.setdefault(str(run), str(name))
    ident = [
        (names[i], str(h or ""), gpu_of_run.get(str(r), "")) if is_cpu[i] else None
        for i, (h, r) in enumerate(zip(df["host"], df["run_id"], strict=True))
    ]
    hosts_of: dict[str, set[tuple[str, str]]] = {}
    for key in ident:
        if key is not None:
            hosts_of.setdefault(key[0], set()).add(key[1:])
    out = []
    for name, key in zip(names, ident, strict=True):
        shared = key is not None and len(hosts_of[key[0]]) > 1
        if not shared:
            out.append(name)
            continue
        ids = hosts_of[key[0]]
        hosts, gpus = {h for h, _ in ids}, [g for _, g in ids]
        out.append(f"{name} ({_host_label(key[1], key[2], hosts, gpus)})")
    return out
