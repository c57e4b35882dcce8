"""The report's machines table: one row per distinct machine and software stack, its runs folded in.

Why apart from the number formats (`deepgap.render.formatting`): a machine is a grouping of runs (host,
device, driver, torch, …), not a format; the report's "Machines" section and the per-machine tables read it.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

MACHINE_KEYS = ["device_name", "cpu_model", "driver", "torch", "torch_cuda", "cudnn", "python", "os"]


def machine_key(r: dict[str, Any]) -> tuple:
    """What makes two runs "the same machine and software stack"."""
    env = r.get("env") or {}
    return (r.get("host", ""), *(str(env.get(k, "–")) for k in MACHINE_KEYS), r.get("deepgap_version", ""))


def machine_label(r: dict[str, Any]) -> str:
    """``NVIDIA H100 80GB HBM3 on vm``."""
    env = r.get("env") or {}
    return f"{env.get('device_name') or env.get('device') or '?'} on {r.get('host', '?')}"


def machines(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per distinct machine and software stack (host, device, driver, torch, …), runs folded in.

    A store merged from many runs on one box reads as one row, not one per run; a run on the same host's
    CPU is its own machine (another device).
    """
    groups: dict[tuple, dict[str, Any]] = {}
    for r in runs:
        env = r.get("env") or {}
        g = groups.setdefault(
            machine_key(r),
            {
                "label": machine_label(r),
                "cells": [str(env.get(k, "–")) for k in MACHINE_KEYS[1:]]
                + [str(r.get("deepgap_version", ""))],
                "runs": [],
            },
        )
        g["runs"].append(
            {
                "run_id": r["run_id"],
                "status": r.get("status", ""),
                "command": r.get("command", ""),
                "started": _dt.datetime.fromtimestamp(r["created_at"]).isoformat(timespec="minutes")
                if r.get("created_at")
                else "",
            }
        )
    return list(groups.values())


MACHINE_HEADERS = ["machine", "runs", "CPU", "driver", "torch", "CUDA", "cuDNN", "python", "OS", "deepgap"]
