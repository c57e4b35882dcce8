"""A served decoder's engine: the model it builds and the decode step it runs, as the sweep decodes.

Runs in the worker process only. The engines are the sweep's (`deepgap.measure.llm_workload.DECODE_ENGINES`,
what `deepgap.serving.run.llm_spec.LLM_ENGINES` accepts), applied to the server's slot step
(`deepgap.serving.worker.llm_executor.SlotSteps`: ``Llama.decode_slots``, a position per row):

- ``eager``: the step as it is; ``cudagraph``: captured as one CUDA graph per slot count;
- ``compile-reduce-overhead``: ``torch.compile`` of ``decode_slots`` (``dynamic=False``: one compile per slot
  count), then captured per slot count (reduce-overhead is compile + CUDA graphs);
- ``quant``: every Linear swapped for an 8-bit one by the sweep's own function
  (`deepgap.measure.decode_config.LINEAR_SWAPS`: fp8 or int8 weights per output channel, the rest bf16),
  compiled and captured as above. On a CPU the 8-bit Linears compute through their reference arithmetic
  (`deepgap.measure.quant.linear.use_reference`: the tensor-core products are CUDA's) and the step stays
  eager, so the path runs, slowly, where there is no GPU.

An engine with a compile mode compiles its packed admissions too (`packed_prefill`), the token count dynamic;
``DEEPGAP_DECODE_PREFILL=eager`` keeps them eager.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch._dynamo  # in every worker anyway (the fork server preloads it, `deepgap.drive.handle`)

from deepgap.core.records import Status
from deepgap.measure.device import torch_dtype
from deepgap.measure.llm_steps import prefill_compiles
from deepgap.measure.llm_workload import DECODE_ENGINES
from deepgap.measure.models.llama_cache import codes_of
from deepgap.measure.models.llama_net import build_llama
from deepgap.serving.run.process import SetupFailed


@dataclass(frozen=True)
class ServedStep:
    """How the slot step runs: captured as a CUDA graph, compiled first (the mode), and in words."""

    graph: bool
    compile_mode: str | None
    label: str


def served_step(engine: str, cuda: bool) -> ServedStep:
    """The slot step of ``engine`` on this device; a skipped set-up where it needs a GPU and has none."""
    plan = DECODE_ENGINES[engine]
    if not cuda and plan.cuda_only:
        if engine == "quant":
            return ServedStep(False, None, "eager static step, 8-bit Linears in reference arithmetic (CPU)")
        raise SetupFailed(Status.SKIPPED, f"the {engine} decode step needs a CUDA device")
    graph = plan.step == "cuda-graph"
    if not graph:
        return ServedStep(False, None, "eager static step")
    compiled = f"torch.compile ({plan.compile_mode}) + " if plan.compile_mode else ""
    return ServedStep(True, plan.compile_mode, f"{compiled}cuda-graph per slot count")


def packed_prefill(model, compile_mode: str | None) -> tuple[Callable, str]:
    """``(prefill_packed as the admissions run it, its words)``: eager, or compiled with the token rows dynamic.

    Why dynamic: a packed admission is one of 23 token buckets (`deepgap.serving.sim.packing`), and a compile a
    bucket would be 23 compiles of the decoder; with the token count symbolic it compiles once for every bucket
    (llama-tiny on the CPU, `tests/serving/test_llm_packed_compile.py`), and each bucket's CUDA graph is
    captured from it. Floats stay constants (``specialize_float``): ``dynamic=True`` makes every float a symbol
    (RMSNorm's eps, Embedding's unused norm_type, the fp8 cache's FP8_MAX), and one Inductor cannot turn into
    a tensor restarts Dynamo's analysis, tracing the decoder twice (torch 2.11 to 2.14: "Restarting analysis due
    to _tensorify_python_scalars"; session 51). Why by default where the step compiles: on one H200
    (session 45, results/h200/session45) 8B fp8 at MLPerf's limits, 512 slots, fp8 cache, served 11,836 output
    tokens/s with eager admissions and 17,754 compiled (TPOT p50 39.9 -> 26.8 ms: each step carries its
    admissions), the same tokens as eager in the GPU test. ``DEEPGAP_DECODE_PREFILL=eager`` keeps them eager.
    """
    if not prefill_compiles(compile_mode):  # the sweep's rule for its prefill
        return model.prefill_packed, ""
    fn = torch.compile(model.prefill_packed, mode=compile_mode, dynamic=True)
    if hasattr(torch._dynamo.config, "specialize_float"):  # floats were constants before it (older torch)
        fn = torch._dynamo.config.patch(specialize_float=True)(fn)  # read as it traces (docstring)
    return fn, f"compiled ({compile_mode}, token rows dynamic)"


def served_model(
    model: str, precision: str, seed: int, device: str, kv_cache: str | None = None
) -> torch.nn.Module:
    """The decoder with seeded weights on ``device``: cast to ``precision``, or its Linears in 8 bits.

    ``kv_cache`` "fp8" (``--kv-cache fp8``): its cache holds e4m3 codes (`Llama.kv_codes`, set here, before
    the executor's `Llama.setup_cache` allocates it), as the sweep's `deepgap.measure.decode_config` sets them.
    """
    from deepgap.measure import llm_attention
    from deepgap.measure.decode_config import LINEAR_SWAPS

    m = build_llama(model, seed=seed, device=device)
    m.kv_codes = codes_of(kv_cache)
    if precision not in LINEAR_SWAPS:
        m = m.to(torch_dtype(precision))
        llm_attention.plug(m)  # the slot step's attention: each row read up to its own position, on a GPU
        return m
    m = LINEAR_SWAPS[precision](m)
    llm_attention.plug(m)
    if not device.startswith("cuda"):
        from deepgap.measure.quant.linear import use_reference

        use_reference(m)
    return m


def allow_compiles(slot_counts: int) -> None:
    """Room in dynamo's cache for one compile of the step per slot count (and the check's), not its default 8."""
    cfg = torch._dynamo.config
    name = (
        "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    )  # renamed in torch 2.7
    setattr(cfg, name, max(getattr(cfg, name), slot_counts + 4))
