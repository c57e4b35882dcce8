"""Measuring one decode configuration in the worker: build the decoder, check it against fp32, time it.

Why apart from `deepgap.measure.configuration` (which dispatches here for a `ConfigSpec` with
``output_len``): a decode configuration is no forward pass of a prepared engine on a fixed batch; it is a
greedy generation through a static KV cache, timed by `deepgap.measure.llm_timing.measure_decode` (TTFT,
each decode step, a pipelined window), with the step the engine names (`llm_workload.DECODE_ENGINES`).

What is stored (`core.result_details.Decode`, and the results row's own columns):

- the row's latency statistics are the **TPOT** samples (seconds per decode step, every step of every
  timed generation, per generation in the samples table); ``throughput_ips`` is batch / median TPOT
  (decode tokens/s with its CI), ``throughput_pipelined_ips`` the pipelined windows' decode tokens/s;
  ``flops_per_image`` is the analytic FLOPs per decode token, so the datasheet-peak guard applies;
- energy per token from the pipelined decode windows (`MeasureTelemetry`: each window's "images" are
  its batch × steps tokens);
- correctness on the first `CHECK_ROWS` sequences: the engine's greedy tokens over the first
  `CHECK_TOKENS` outputs against an fp32 reference's (same weights, same device), and the logits of the
  same positions, teacher-forced with the reference's tokens through the eager step, by relL2/cosine
  (`deepgap.measure.correctness.compare`, the precision's bounds).

`LINEAR_SWAPS` is the hook for quantized weights: precision → a function that replaces the fp32
decoder's ``nn.Linear`` layers on its device and returns it: fp8 and int8 through the quant engine's
Linear path (`deepgap.measure.quant.linear`), weights per output channel, the rest of the decoder in bf16.
A step of at most `WEIGHT_ONLY_ROWS` sequences keeps its activations in bf16 and reads the 8-bit weights
through the weight-only GEMV (`deepgap.measure.quant.gemv`: at a small batch the step is bound by the
weights' bytes); a larger batch and the prefill quantize activations per token (a row is a token: its
amax is cheap and needs no calibration) for the tensor cores' 8-bit GEMM. A batch-1 step runs
`deepgap.measure.llm_fused`'s layer: the norms, SwiGLU and the residual adds inside its four GEMVs.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from deepgap.core import guards, stats, switches
from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.core.result_details import Correctness, Decode, DeviceMemUsed, ResultDetails
from deepgap.measure import correctness, llm_angles, llm_attention, llm_fused
from deepgap.measure.device import CudaEventClock, set_tf32, torch_dtype
from deepgap.measure.llm_cost import Itemsizes, decode_cost
from deepgap.measure.llm_steps import make_prefill, make_step
from deepgap.measure.llm_timing import DecodeResult, measure_decode, prompts
from deepgap.measure.llm_workload import CHECK_ROWS, CHECK_TOKENS, DECODE_ENGINES, QUANT_PRECISIONS
from deepgap.measure.models.llama_cache import codes_of
from deepgap.measure.models.llama_net import build_llama
from deepgap.measure.protocol import MeasureRequest
from deepgap.measure.quant import gemv
from deepgap.measure.telemetry.measuring import MeasureTelemetry
from deepgap.measure.timing import HostClock, ok_result
from deepgap.measure.worker import WorkerState, nvml_used_bytes, true_peak


def _quantized(precision: str) -> Callable[[torch.nn.Module], torch.nn.Module]:
    def swap(model: torch.nn.Module) -> torch.nn.Module:
        from deepgap.measure.quant.linear import LinearQuant
        from deepgap.measure.quant.transformer import quantize_linears

        how = LinearQuant(precision, "row", weight_only_rows=WEIGHT_ONLY_ROWS)
        quantize_linears(model, how, out_dtype=torch.bfloat16)
        if switches.read("DEEPGAP_DECODE_FUSED") == "1":
            llm_fused.fuse(model)  # one-row steps: norms, SwiGLU and residuals inside the GEMVs
        return model

    return swap


# a decode step of at most this many sequences reads its 8-bit weights through the weight-only GEMV (bf16
# activations, `deepgap.measure.quant.gemv`): bound by the weights' bytes, it needs no activation codes
WEIGHT_ONLY_ROWS = 16

# precision → fn(fp32 decoder on its device) -> the decoder with its Linear layers replaced (module doc)
LINEAR_SWAPS: dict[str, Callable[[torch.nn.Module], torch.nn.Module]] = {
    p: _quantized(p) for p in QUANT_PRECISIONS
}


def measure_decode_config(state: WorkerState, req: MeasureRequest) -> Result:
    """One decode configuration's `Result` (a skipped one where the engine or precision cannot run here)."""
    spec = req.spec
    plan = DECODE_ENGINES.get(spec.engine)
    if plan is None:
        return Result(spec=spec, status=Status.SKIPPED, reason=f"engine {spec.engine!r} has no decode step")
    if plan.cuda_only and state.caps.kind != "cuda":
        return Result(spec=spec, status=Status.SKIPPED, reason=f"{spec.engine} decode needs a CUDA device")
    if spec.precision not in plan.precisions:
        why = f"{spec.engine} decodes in {', '.join(plan.precisions)}, not {spec.precision}"
        return Result(spec=spec, status=Status.SKIPPED, reason=why)
    torch.set_num_threads(spec.threads or state.default_threads)
    set_tf32("fp32")  # the reference in true fp32; the measured model's own flags are set below
    cuda = state.caps.kind == "cuda"
    clock = CudaEventClock(spec.device) if cuda else HostClock()
    tel = MeasureTelemetry.for_request(state.telemetry, spec.device, req.telemetry, spec.batch_size)
    if tel is not None and tel.thermal_mode:  # the run's thermal warm-up: the prefill as its load, no check
        set_tf32(spec.precision)
        model = _decoder(spec, req.seed)
        ids = prompts(model.shape.vocab, spec.batch_size, spec.input_len, req.seed).to(spec.device)
        model.setup_cache(spec.batch_size, spec.input_len)
        with torch.inference_mode():
            return tel.thermal(lambda: model.prefill(ids), clock, spec)
    ref_tokens, ref_logits = _reference(state, spec, req.seed)
    set_tf32(spec.precision)
    if cuda:
        torch.cuda.reset_peak_memory_stats(spec.device)
    model = _decoder(spec, req.seed)
    check = _check(model, spec, req.seed, ref_logits)
    step = make_step(model, plan.step, plan.compile_mode or "default", plan.compile_mode is not None)
    prefill = make_prefill(model, plan.compile_mode)
    with tel if tel is not None else contextlib.nullcontext():
        r = measure_decode(
            model,
            spec.batch_size,
            spec.input_len,
            spec.output_len,
            tel.clock(clock) if tel is not None else clock,
            repeats=req.protocol.repeats,
            warmup=_warmup_runs(req, plan.step),
            seed=req.seed,
            step=None if plan.step == "eager" else step,
            prefill=prefill,
        )
    result = _result(spec, req, model, r, check, ref_tokens)
    result.details.decode.step, result.details.decode.compile_mode = plan.step, plan.compile_mode
    result.details.decode.pdl = getattr(step, "pdl", None)
    result.details.decode.prefill = prefill.label
    result.details.decode.angles = llm_angles.describe(model)
    if spec.precision in LINEAR_SWAPS:
        result.details.decode.tiles = gemv.chosen() or None
    if plan.step != "eager":  # the eager step attends by SDPA over the positions written, always
        result.details.decode.attention = llm_attention.describe(
            model, spec.batch_size, spec.input_len + spec.output_len
        )
    if tel is not None:
        tel.finish(result)
        t = result.details.telemetry
        result.details.decode.joules_per_token = t.joules_per_image if t is not None else None
        result.details.decode.energy_window_s = t.energy_window_s if t is not None else None
    _memory(result, spec.device, cuda)
    return guards.rate_checked(result, state.caps.name)


def _warmup_runs(req: MeasureRequest, step: str) -> int:
    """Untimed generations before the timed ones: one where the protocol warms up, else none.

    Always one where the step is compiled or captured (or the prefill compiled), so that no timed TTFT or
    TPOT holds a compile or a capture.
    """
    return 1 if req.protocol.warmup > 0 or step != "eager" else 0


def _decoder(spec: ConfigSpec, seed: int) -> torch.nn.Module:
    """The decoder with seeded weights on the configuration's device, in its precision (or swapped Linears).

    ``kv_cache`` "fp8": its cache holds fp8 codes (`deepgap.measure.models.llama_cache`).
    """
    model = build_llama(spec.model, seed=seed, device=spec.device)
    model.kv_codes = codes_of(spec.kv_cache)
    if spec.precision in LINEAR_SWAPS:
        return LINEAR_SWAPS[spec.precision](model)
    return model.to(torch_dtype(spec.precision))


def _rows(spec: ConfigSpec) -> tuple[int, int]:
    """(sequences, first output tokens) the correctness check compares."""
    return min(spec.batch_size, CHECK_ROWS), min(spec.output_len, CHECK_TOKENS)


def _reference(state: WorkerState, spec: ConfigSpec, seed: int) -> tuple[Any, Any]:
    """The fp32 decoder's greedy tokens and teacher-forced logits on the check's rows, once per shape.

    The rows are the first of the measured batch's prompts (a seeded draw's first rows are the same
    whatever the batch). The fp32 model is built on the device and freed before the measured one.
    """
    k, n = _rows(spec)
    key = ("decode-ref", spec.model, seed, spec.device, spec.input_len, k, n)
    if key not in state.held:
        ref = build_llama(spec.model, seed=seed, device=spec.device)
        ids = prompts(ref.shape.vocab, k, spec.input_len, seed).to(spec.device)
        tokens, logits = _teacher_forced(ref, ids, n, None)
        state.held = {
            k2: v for k2, v in state.held.items() if not (isinstance(k2, tuple) and k2[0] == key[0])
        }
        state.held[key] = (tokens, logits)
        del ref
        gc.collect()
        if state.caps.kind == "cuda":  # its blocks back to the device: the measured row's memory is its own
            torch.cuda.empty_cache()
    return state.held[key]


def _teacher_forced(model, ids, n: int, forced) -> tuple[Any, Any]:
    """Greedy tokens ``(rows, n)`` and the logits ``(rows, n, vocab)`` that chose them, on the CPU in fp32.

    ``forced``: tokens to feed instead of the model's own (the reference's), so both models' logits
    are taken at the same inputs; None feeds back the model's own greedy choice.
    """
    b, s = ids.shape
    model.setup_cache(b, s + n)
    out_t, out_l = [], []
    with torch.inference_mode():
        logits = model.prefill(ids)
        for i in range(n):
            out_l.append(logits.float().cpu())
            out_t.append(logits.argmax(-1).cpu())
            if i == n - 1:
                break
            nxt = (forced[:, i] if forced is not None else out_t[-1]).to(ids.device).view(b, 1)
            logits = model.decode_step(nxt, s + i)
    return torch.stack(out_t, 1), torch.stack(out_l, 1)


def _check(model, spec: ConfigSpec, seed: int, ref_logits) -> correctness.Agreement:
    """The measured model's logits at the reference's inputs against the reference's (relL2, cosine)."""
    k, n = _rows(spec)
    ids = prompts(model.shape.vocab, k, spec.input_len, seed).to(spec.device)
    forced = ref_logits.argmax(-1)
    _, logits = _teacher_forced(model, ids, n, forced)
    bounds = correctness.bounds_of(spec.precision, spec.kv_cache)  # an fp8 cache: fp8's, where looser
    return correctness.compare(logits.reshape(k * n, -1), ref_logits.reshape(k * n, -1), bounds)


def _result(spec: ConfigSpec, req: MeasureRequest, model, r: DecodeResult, check, ref_tokens) -> Result:
    """The stored row: TPOT as its latency, decode tokens/s as its throughput, the `Decode` figures."""
    s = r.summary()
    itemsize = model.embed_tokens.weight.element_size()
    context = spec.input_len + (spec.output_len - 2) / 2  # the mean context of the decode steps
    linear = 1 if spec.precision in QUANT_PRECISIONS else itemsize  # 8-bit Linears: 1 byte per weight
    sizes = Itemsizes(linear=linear, other=itemsize, kv=model.cache.k[0].element_size())
    cost = decode_cost(model.shape, spec.batch_size, context, sizes)
    k, n = _rows(spec)
    got = np.array([row[:n] for row in r.tokens[:k]])
    want = ref_tokens.numpy()
    same = got == want
    bad_cols = np.nonzero(~same.all(0))[0]
    decode = Decode(
        input_len=spec.input_len,
        output_len=spec.output_len,
        runs=s["runs"],
        warmup_runs=r.warmup_runs,
        **{key: s[key] for key in _SUMMARY_KEYS},
        bytes_per_token=cost.bytes_per_token,
        flops_per_token=cost.flops_per_token,
        cost_context=context,
        tokens_checked=int(same.size),
        token_agreement=float(same.mean()),
        first_mismatch=int(bad_cols[0]) if len(bad_cols) else None,
    )
    weights = model.shape.params()  # an 8-bit Linear keeps its weights as buffers: count them from the shape
    result = ok_result(
        spec,
        r.tpot_samples(),
        throughput_pipelined_ips=s["pipelined_decode_tok_s"],
        n_repeats=len(r.runs),
        warmup=decode.warmup_runs,
        cv_repeats=stats.coefficient_of_variation([float(np.median(x.steps_s)) for x in r.runs]),
        flops_per_image=cost.flops_per_token,
        params=weights,
        samples_s=[list(x.steps_s) for x in r.runs],
    )
    result.details = ResultDetails(
        correctness=Correctness.from_json({**check.to_dict(), "weights": "random"}),
        torch_threads=torch.get_num_threads(),
        decode=decode,
    )
    return result


_SUMMARY_KEYS = (
    "ttft_median_s",
    "ttft_n",
    "tpot_median_s",
    "tpot_n",
    "tpot_tail_s",
    "tpot_tail_kind",
    "e2e_median_s",
    "decode_tok_s",
    "pipelined_decode_tok_s",
    "output_tok_s",
    "total_tok_s",
    "kv_cache_bytes",
    "weight_bytes",
)


def _memory(result: Result, device: str, cuda: bool) -> None:
    """Peaks of the whole configuration (weights, cache, the check) on a GPU; the process's RSS anywhere."""
    if cuda:
        result.peak_mem_allocated_bytes = int(torch.cuda.max_memory_allocated(device))
        result.peak_mem_reserved_bytes = int(torch.cuda.max_memory_reserved(device))
        final = nvml_used_bytes(device)
        t = result.details.telemetry
        sampled = t.max_device_mem_used_bytes if t is not None else None
        result.device_mem_used_bytes = true_peak(final, sampled)
        result.details.device_mem_used = DeviceMemUsed(final_bytes=final, sampled_max_bytes=sampled)
    with contextlib.suppress(ImportError):
        import psutil

        result.host_rss_bytes = int(psutil.Process(os.getpid()).memory_info().rss)
