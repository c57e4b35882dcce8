"""Sweeps past one GPU and one machine: several local GPUs, a Ray cluster, and merging stores.

Why a separate package: the one-machine path (`deepgap.api.run` → `deepgap.drive.runner.SweepRunner` →
`Store.record`) stays exactly as it is; a fleet reuses it per device. Two backends produce results,
one driver writes them (`deepgap.drive.loop.drive`, with the fleet's plan in `deepgap.fleet.launch`):

- `deepgap.fleet.scheduler`: one host, one `SweepRunner` (one worker process) per GPU, each in its
  own thread, pulling whole batch ladders from a shared queue in plan order;
- `deepgap.fleet.ray_backend`: one Ray task per configuration, placed on any node of a cluster
  (``pip install 'deepgap[ray]'``; nothing else needs Ray).

`deepgap.fleet.merge` combines stores written on separate machines. Importing this package is cheap
and never imports Ray or torch.
"""

from __future__ import annotations

import os

from deepgap.core.errors import DeepgapError


def stored_fleet(store: str, resume: str | bool) -> dict | None:
    """The fleet settings of the run ``--resume`` would continue, or None for a one-machine run.

    Errors (no store, no unfinished run) are left to the caller's normal resume path.
    """
    if not os.path.exists(store):
        return None
    from deepgap.store import Store

    try:
        s = Store(store, readonly=True)
    except DeepgapError:
        return None
    try:
        row = s.latest_unfinished() if resume is True else s.run(str(resume))
    except DeepgapError:
        return None
    finally:
        s.close()
    fleet = (row or {}).get("env", {}).get("fleet")
    return fleet if isinstance(fleet, dict) else None
