"""Fault-injection models: they let tests prove that one bad configuration costs only itself.

``fault:crash`` kills its worker process, ``fault:hang`` never returns, ``fault:oom`` raises
``torch.OutOfMemoryError`` from batch 4 on, ``fault:error`` raises a plain exception. Hidden from
``deepgap list models`` unless ``--all`` is given.
"""

from __future__ import annotations

import os
import signal
import time

from deepgap.measure.models.registry import MODELS, ModelEntry
from deepgap.measure.models.tiny import build_tinycnn

OOM_FROM_BATCH = 4


def _wrap(kind: str):
    def build(resolution: int):
        import torch
        from torch import nn

        inner = build_tinycnn(resolution)

        class Faulty(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, x):
                if kind == "crash":
                    os.kill(os.getpid(), signal.SIGSEGV)
                elif kind == "hang":
                    time.sleep(3600)
                elif kind == "oom" and x.shape[0] >= OOM_FROM_BATCH:
                    raise torch.cuda.OutOfMemoryError("fault:oom: simulated out of memory")
                elif kind == "error":
                    raise RuntimeError("fault:error: simulated failure")
                return self.inner(x)

        return Faulty()

    return build


for _kind in ("crash", "hang", "oom", "error"):
    MODELS.add(
        f"fault:{_kind}",
        ModelEntry(
            build=_wrap(_kind),
            family="fault",
            default_resolution=32,
            hidden=True,
            num_classes=10,
            description=f"fault injection: {_kind}",
        ),
    )
