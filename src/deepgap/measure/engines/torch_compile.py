"""torch.compile (TorchInductor) engines, one registered name per mode.

- ``compile``: the default mode (fused Triton/C++ kernels, no CUDA graphs);
- ``compile-max-autotune``: ``max-autotune-no-cudagraphs`` (benchmarks GEMM/conv templates: minutes);
- ``compile-reduce-overhead``: CUDA graphs around the compiled graph (the small-batch winner);
- ``compile-freeze``: ``reduce-overhead`` with Inductor *freezing* (weights become constants, so
  conv+BN fold and layouts are chosen once), which is why it is usually the fastest torch variant.

Compilation is lazy, so ``prepare`` calls the compiled model on the configuration's example batch
(static shapes, ``dynamic=False``) under ``inference_mode`` — as the timed loop will — and stores
that first call's time as ``compile_s`` in the engine info, outside the timed window, then makes
two more calls (CUDA-graph trees record on the second). A model's ``nn.MultiheadAttention`` (ViT's)
is first unfused into Linears and one SDPA call (`deepgap.measure.models.attention`): traced, the
module loses its eager fused path, and ViT-B/16 compiled ran slower than eager (9.1k against 10.0k
img/s on one H200; 10.6k unfused). Each configuration starts from
``torch._dynamo.reset()``: otherwise guards from earlier configurations pile up in the worker and,
past Dynamo's recompile limit, the model would silently run eagerly. A failed compilation raises
`CompileFailed` with the compiler's message, which the worker stores as an error.

What the CUDA graphs read (reduce-overhead, freeze) stays alive as long as the runner: the returned
``OptimizedModule`` holds the model; frozen constants and the CUDA-graph trees live in Dynamo's
process-wide caches and are freed together by the next ``torch._dynamo.reset()``, after which an
older runner recompiles instead of replaying freed memory (`tests/measure/test_graph_runner_gpu.py`).
"""

from __future__ import annotations

import shutil
import time
from typing import Any, ClassVar

import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters
from torch.utils._triton import has_triton

from deepgap.core.precision import float_precision_support
from deepgap.core.records import TEXT_INPUTS
from deepgap.measure.device import torch_dtype
from deepgap.measure.engines.base import ENGINES, Engine, Prepared, example_on
from deepgap.measure.engines.eager import to_device
from deepgap.measure.models.attention import unfuse_attention

WARM_CALLS = 2  # after the compiling call: CUDA-graph trees warm up, then record


class CompileFailed(RuntimeError):
    """torch.compile raised while compiling; the message names the mode and the compiler's error."""


class CompileEngine(Engine):
    """``torch.compile(model, mode=…)``; subclasses pick the mode and freezing."""

    mode: ClassVar[str | None] = None
    inputs = ("default", *TEXT_INPUTS)  # a mixed-length text batch: fixed lengths per configuration
    freezing: ClassVar[bool] = False

    def supports(self, spec, caps):  # noqa: D102
        why = super().supports(spec, caps) or float_precision_support(spec.precision, caps)
        if why:
            return why
        if caps.kind == "cuda":
            if not has_triton():
                return (
                    "unavailable: torch.compile on a GPU needs Triton (pip install triton), which is missing"
                )
        elif not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
            return "unavailable: torch.compile on a CPU needs a C++ compiler (g++) on PATH"
        return None

    def prepare(self, model, spec, example):  # noqa: D102
        t0 = time.perf_counter()
        model = to_device(model, spec)
        unfused = unfuse_attention(model)
        x = example_on(example, spec.device, torch_dtype(spec.precision))  # keeps channels_last strides
        torch._dynamo.reset()  # fresh guards and caches for this configuration (see the module docstring)
        counters.clear()
        compiled = torch.compile(model, mode=self.mode, dynamic=False)
        cuda = spec.device.startswith("cuda")
        sync = (lambda: torch.cuda.synchronize(spec.device)) if cuda else (lambda: None)
        try:
            with (
                inductor_config.patch(freezing=self.freezing),
                torch._dynamo.config.patch(suppress_errors=False),
                torch.inference_mode(),
            ):
                t1 = time.perf_counter()
                compiled(x)
                sync()
                compile_s = time.perf_counter() - t1
                for _ in range(WARM_CALLS):
                    compiled(x)
                sync()
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            if "out of memory" in msg.lower():
                raise
            raise CompileFailed(
                f"torch.compile(mode={self.mode or 'default'}, freezing={self.freezing}) failed: "
                f"{type(exc).__name__}: {msg}"
            ) from exc
        info: dict[str, Any] = {
            "mode": self.mode or "default",
            "freezing": self.freezing,
            "dynamic": False,
            "compile_s": compile_s,
            "torch": torch.__version__,
            **_compile_counters(counters),
        }
        if unfused:
            info["unfused_attention"] = unfused
        return Prepared(run=compiled, input_dtype=x.dtype, setup_s=time.perf_counter() - t0, info=info)


def _compile_counters(counters) -> dict[str, Any]:
    """Graphs compiled, graph breaks and Inductor cache hits.

    A compiled model that broke into pieces, or came from the on-disk cache (a shorter ``compile_s``), says so.
    """
    breaks = counters.get("graph_break", {})
    ind = counters.get("inductor", {})
    return {
        "graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
        "graph_breaks": int(sum(breaks.values())),
        "graph_break_reasons": [str(k)[:200] for k in list(breaks)[:5]],
        "fxgraph_cache_hit": int(ind.get("fxgraph_cache_hit", 0)),
        "fxgraph_cache_miss": int(ind.get("fxgraph_cache_miss", 0)),
    }


# registered name → (mode, freezing, description): one engine per mode, alike but for these (module docstring)
_MODES = {
    "compile": (
        None,
        False,
        "torch.compile (Inductor), default mode; compile time stored as engine_info.compile_s",
    ),
    "compile-max-autotune": (
        "max-autotune-no-cudagraphs",
        False,
        "torch.compile mode=max-autotune-no-cudagraphs (autotuned GEMM/conv templates; minutes to compile)",
    ),
    "compile-reduce-overhead": (
        "reduce-overhead",
        False,
        "torch.compile mode=reduce-overhead (CUDA graphs on a GPU)",
    ),
    "compile-freeze": (
        "reduce-overhead",
        True,
        "torch.compile mode=reduce-overhead + Inductor freezing (weights as constants, conv-BN folded)",
    ),
}
for _name, (_mode, _freezing, _description) in _MODES.items():
    _fields = {
        "name": _name,
        "mode": _mode,
        "freezing": _freezing,
        "description": _description,
        "__module__": __name__,
    }
    ENGINES.add(_name, type(f"CompileEngine[{_name}]", (CompileEngine,), _fields))
