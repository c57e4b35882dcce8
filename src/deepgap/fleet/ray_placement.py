"""Where a Ray task may run: ``--where`` parsed and turned into the Ray resources a task asks for.

Why apart from the backend: placement is a pure function of the user's ``--where`` and the cluster's
advertised resources, checked before anything is submitted (an impossible ``--where`` is the user's
error, named with what the cluster does offer), while the backend is the long-lived driver loop.

``--where gpu=L4`` uses the ``accelerator_type:<type>`` resource that Ray itself advertises on
every NVIDIA GPU node (``L4``, ``T4``, ``H100`` …; detected from GPU 0 of the node), so nodes need
no set-up; ``node=IP`` uses Ray's ``node:<ip>`` resource and any other ``KEY=VALUE`` a custom
resource ``KEY:VALUE`` that nodes advertise with ``ray start --resources``.
"""

from __future__ import annotations

import re
from typing import Any

from deepgap.core.errors import UsageError

_TAG = 0.001  # the share of a label-like resource a task asks for (any number of tasks fit)


def import_ray():
    """The ``ray`` module, or a `UsageError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--ray needs the ray package, which is not installed", "pip install 'deepgap[ray]'"
        ) from None
    return ray


def parse_where(items: list[str] | dict[str, str] | None) -> dict[str, str]:
    """``["gpu=L4", "node=10.0.0.5"]`` (``--where``, repeatable) → ``{"gpu": "L4", "node": "10.0.0.5"}``."""
    if not items:
        return {}
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        pairs = []
        for text in items:
            key, sep, value = str(text).partition("=")
            if not sep or not key.strip() or not value.strip():
                raise UsageError(f"--where {text!r} is not KEY=VALUE", "write e.g. --where gpu=L4")
            pairs.append((key, value))
    out: dict[str, str] = {}
    for key, value in pairs:
        k, v = str(key).strip().lower(), str(value).strip()
        if k in out:
            raise UsageError(f"--where {k}= is given twice", "give each key once")
        out[k] = v
    return out


def _accelerator_type(name: str) -> str:
    """A GPU name as Ray's ``accelerator_type`` spells it: ``NVIDIA L4`` → ``L4``, ``Tesla T4`` → ``T4``."""
    m = re.match(r"^(?:NVIDIA\s+)?(?:Tesla\s+)?([A-Za-z0-9]+)", name.strip())
    return m.group(1) if m else name.strip()


def where_resources(where: dict[str, str], nodes: list[dict[str, Any]]) -> dict[str, float]:
    """The Ray resources a task asks for so that it lands on a node matching ``where``.

    Raises:
        UsageError: no alive node offers one of them (the message lists what the cluster offers).
    """
    offered = {k for n in nodes for k in n["Resources"]}
    out: dict[str, float] = {}
    for key, value in where.items():
        if key == "gpu":
            types = sorted(k.split(":", 1)[1] for k in offered if k.startswith("accelerator_type:"))
            pick = next((t for t in types if t.lower() == value.lower()), None) or next(
                (t for t in types if t.lower() == _accelerator_type(value).lower()), None
            )
            if pick is None:
                raise UsageError(
                    f"no node of the Ray cluster has gpu={value}",
                    f"this cluster's GPU types: {', '.join(types) or 'none'}",
                )
            out[f"accelerator_type:{pick}"] = _TAG
        elif key == "node":
            if f"node:{value}" not in offered:
                ips = sorted(k.split(":", 1)[1] for k in offered if k.startswith("node:") and "__" not in k)
                raise UsageError(
                    f"no alive node of the Ray cluster has address {value}",
                    f"its nodes: {', '.join(ips) or 'none'}",
                )
            out[f"node:{value}"] = _TAG
        else:
            if f"{key}:{value}" not in offered:
                raise UsageError(
                    f"no node of the Ray cluster advertises {key}:{value}",
                    f"start nodes with ray start --resources='{{\"{key}:{value}\": 1000}}'",
                )
            out[f"{key}:{value}"] = _TAG
    return out
