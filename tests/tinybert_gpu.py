"""tinybert swept on a GPU in this process: the small grid two GPU tests share (one batch, sequence 64).

Why a helper: tests/measure/test_text_input_gpu.py (packed and padded inputs) and
tests/measure/engines/test_bert_gpu.py (the engines on the default input) built the same `SweepSpec` apart
from their engines, precisions, batch and input axes.
"""

from __future__ import annotations

from deepgap.core.records import Result
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.inprocess import InProcessWorker
from deepgap.drive.plan import expand
from deepgap.drive.runner import SweepRunner


def sweep_tinybert(engines: tuple[str, ...], precisions: tuple[str, ...], batch: int, **more) -> list[Result]:
    """Every configuration's result: a short, telemetry-free sweep on ``cuda`` (``more``: other axes)."""
    spec = validate(
        SweepSpec(
            models=("tinybert",),
            engines=engines,
            precisions=precisions,
            batch_sizes=(batch,),
            seq_lens=(64,),
            device="cuda",
            warmup=2,
            iterations=5,
            repeats=2,
            max_time_s=5.0,
            telemetry=False,
            idle_s=0.0,
            **more,
        )
    )
    runner = SweepRunner(spec, "cuda", worker=InProcessWorker("cuda"))
    return list(runner.run(expand(spec, "cuda")))
