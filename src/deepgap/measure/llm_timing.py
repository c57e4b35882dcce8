"""Decode measured as a user of a decoder sees it: TTFT, per-token latencies (TPOT), tokens/s, memory.

One *run* is one greedy generation at a fixed batch: the prefill of ``batch`` prompts of
``input_len`` tokens, which yields the first output token (its time is the **TTFT** at that batch),
then ``output_len - 1`` decode steps of one token per sequence, each timed on its own with the device
synchronized before and after (the **TPOT** samples: what a streaming client waits between tokens).
With ``pipelined`` a second generation of the same prompts runs its decode steps back to back and is
timed as one window, the host never waiting for the device in between (what a busy server loop gets;
the gap between the two is the per-step synchronisation and launch overhead that CUDA graphs remove).

The figures (`DecodeResult.summary`), each with its n:

- ``ttft_median_s`` over runs; ``tpot_median_s`` over every decode step of every run, and its tail:
  a p99 only where n supports one (n ≥ 368, the rule of `deepgap.analysis.tails`), else the maximum
  of the n samples, labelled so;
- ``decode_tok_s``: batch × decode steps / decode time (synchronized steps), and
  ``pipelined_decode_tok_s`` from the windows;
- ``output_tok_s``: batch × output_len / (TTFT + decode time), the end-to-end output rate that
  MLPerf and TensorRT-LLM's tables report; ``total_tok_s`` counts input tokens too;
- ``kv_cache_bytes`` (the static cache as allocated, input + output positions) and ``weight_bytes``.

The clock is injected (`deepgap.measure.timing.Clock`): `HostClock` with a device synchronise, or a
scripted clock in tests, so the arithmetic is checked exactly without wall-clock asserts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from deepgap.measure.models.llama_config import check_run
from deepgap.measure.timing import Clock

# `deepgap.analysis.tails.min_samples(0.99)`: the fewest samples whose distribution-free 95% interval of
# the p99 ends below the maximum (analysis sits above measure, so the rule is restated; a test keeps
# the two equal).
P99_MIN_N = int(math.ceil(math.log(0.025) / math.log(0.99)))

StepFn = Callable[..., object]  # (ids (batch, 1), position: int) -> logits (batch, vocab)

# `greedy` splits a row of logits into this many chunks where the vocabulary divides (the most that do)
GREEDY_CHUNKS = (256, 128, 64, 32)
GREEDY_MAX_ROWS = 8  # more rows fill the GPU with one reduction per row: a plain argmax


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Each row's greedy token ``(rows, 1)``: the first of its largest logits, exactly as ``argmax(-1)``.

    Why not ``argmax`` alone: at batch 1 on a GPU it reduces Llama-3's 128,256 logits in one thread block,
    37 µs a step on one H200 (session 22, 1.5% of an 8B fp8 step). A max over chunks of the row, then over
    the chunks' maxima, is the same token: within a chunk and across chunks the first of equal maxima wins.
    """
    rows, vocab = logits.shape[0], logits.shape[-1]
    flat = logits.reshape(rows, vocab)
    chunks = next((c for c in GREEDY_CHUNKS if vocab % c == 0 and vocab // c >= c), 0)
    if rows > GREEDY_MAX_ROWS or not chunks or flat.device.type != "cuda":
        return flat.argmax(-1, keepdim=True)
    return chunked_argmax(flat, chunks)


def token_step(step: StepFn) -> Callable[..., torch.Tensor]:
    """``next_token(ids, position) -> (rows, 1)``: ``step``'s greedy tokens, in its graph where it has one.

    Why: outside a graph, greedy's reductions and the feeding of its token to the next step are half a dozen
    small kernels between two replays, each a launch the GPU waits for when a step is timed alone
    (`llm_steps._GraphStep.next_token` takes them into the graph).
    """
    nxt = getattr(step, "next_token", None)
    return nxt if nxt is not None else (lambda ids, position: greedy(step(ids, position)))


def chunked_argmax(flat: torch.Tensor, chunks: int) -> torch.Tensor:
    """``flat.argmax(-1, keepdim=True)`` of ``(rows, vocab)`` as a max within ``chunks`` chunks, then across."""
    rows, vocab = flat.shape
    width = vocab // chunks
    best, where = flat.view(rows, chunks, width).max(-1)
    chunk = best.argmax(-1, keepdim=True)
    return chunk * width + where.gather(-1, chunk)


@dataclass(frozen=True)
class DecodeRun:
    """One generation's timings: the prefill, each decode step, and the pipelined window (or None)."""

    prefill_s: float
    steps_s: tuple[float, ...]
    window_s: float | None = None

    @property
    def decode_s(self) -> float:
        """Seconds of the synchronized decode steps."""
        return float(sum(self.steps_s))


@dataclass(frozen=True)
class DecodeResult:
    """Every run of one configuration (batch, input length, output length) and its memory."""

    batch: int
    input_len: int
    output_len: int
    runs: tuple[DecodeRun, ...]
    kv_cache_bytes: int
    weight_bytes: int
    tokens: tuple[tuple[int, ...], ...] = ()  # the first run's greedy tokens, per sequence
    warmup_runs: int = 0  # untimed generations before the runs

    def tpot_samples(self) -> np.ndarray:
        """Every decode step's seconds, pooled over runs."""
        return np.array([s for r in self.runs for s in r.steps_s], dtype=float)

    def tpot_tail(self) -> tuple[float | None, str, int]:
        """(seconds, "p99" or "max", n): a p99 only where n ≥ `P99_MIN_N`, else the sample maximum."""
        x = self.tpot_samples()
        if not len(x):
            return None, "", 0
        if len(x) >= P99_MIN_N:
            return float(np.percentile(x, 99)), "p99", len(x)
        return float(x.max()), "max", len(x)

    def summary(self) -> dict:
        """The configuration's figures (module docstring), flat, with the n each rests on."""
        b, runs = self.batch, self.runs
        steps = self.tpot_samples()
        tail_s, tail_kind, n = self.tpot_tail()
        decode_s = float(steps.sum())
        e2e = [r.prefill_s + r.decode_s for r in runs]
        windows = [r.window_s for r in runs if r.window_s is not None]
        n_steps = self.output_len - 1
        return {
            "batch": b,
            "input_len": self.input_len,
            "output_len": self.output_len,
            "runs": len(runs),
            "ttft_median_s": float(np.median([r.prefill_s for r in runs])),
            "ttft_n": len(runs),
            "tpot_median_s": float(np.median(steps)) if n else None,
            "tpot_n": n,
            "tpot_tail_s": tail_s,
            "tpot_tail_kind": tail_kind,
            "e2e_median_s": float(np.median(e2e)),
            "decode_tok_s": b * n / decode_s if decode_s > 0 else None,
            "pipelined_decode_tok_s": b * n_steps * len(windows) / sum(windows) if sum(windows) > 0 else None,
            "output_tok_s": b * self.output_len * len(runs) / sum(e2e),
            "total_tok_s": b * (self.input_len + self.output_len) * len(runs) / sum(e2e),
            "kv_cache_bytes": self.kv_cache_bytes,
            "weight_bytes": self.weight_bytes,
        }


def prompts(vocab: int, batch: int, input_len: int, seed: int = 0):
    """Seeded uniform token ids ``(batch, input_len)`` on the CPU (no padding: every prompt is full)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, input_len), generator=g, dtype=torch.int64)


def generate(model, ids, output_len: int, step: StepFn | None = None):
    """Greedy tokens ``(batch, output_len)`` through the static cache (set up here), untimed."""
    b, s = ids.shape
    check_run(model.shape, b, s + output_len)
    step = step or model.decode_step
    model.setup_cache(b, s + output_len)
    with torch.inference_mode():
        tok = greedy(model.prefill(ids))
        out = [tok]
        next_token = token_step(step)
        for i in range(output_len - 1):
            tok = next_token(tok, s + i)
            out.append(tok)
    return torch.cat(out, dim=1)


def _timed_run(
    model, ids, output_len: int, clock: Clock, step: StepFn, pipelined: bool, fill=None
) -> tuple[DecodeRun, list]:
    """One generation, the prefill (``fill``, else the model's) and each step timed by ``clock``; then the window.

    The pipelined window only where ``pipelined`` asks for it.
    """
    s = ids.shape[1]
    state: dict = {}
    fill = fill or model.prefill
    next_token = token_step(step)

    def prefill() -> None:
        state["tok"] = greedy(fill(ids))

    def one_step() -> None:
        state["tok"] = next_token(state["tok"], state["pos"])
        state["pos"] += 1

    prefill_s = clock.time_iteration(prefill)
    tokens, steps = [state["tok"]], []
    state["pos"] = s
    for _ in range(output_len - 1):
        steps.append(clock.time_iteration(one_step))
        tokens.append(state["tok"])
    window = None
    if pipelined and output_len > 1:
        # through the clock (synchronized, its time unused): an energy window opens on the host before its
        # start synchronization, so a prefill still running on the device would be billed to the decode
        # window (session 18: up to 1,000 W "measured" on a 700 W H200 at batch 256)
        clock.time_iteration(prefill)
        state["pos"] = s
        window = clock.time_window(one_step, output_len - 1)
    return DecodeRun(prefill_s, tuple(steps), window), tokens


def measure_decode(
    model,
    batch: int,
    input_len: int,
    output_len: int,
    clock: Clock,
    *,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    pipelined: bool = True,
    step: StepFn | None = None,
    prefill=None,
) -> DecodeResult:
    """``repeats`` timed generations (after ``warmup`` untimed ones) of seeded prompts on ``model``'s device.

    ``step`` replaces ``model.decode_step`` (a compiled or CUDA-graph step from `llm_steps`), ``prefill``
    ``model.prefill`` (a compiled one, `llm_steps.make_prefill`); lengths,
    batch and cache size are checked first, one `UsageError` line each.
    """
    from deepgap.measure.models.llama_net import weight_bytes

    if output_len < 1 or input_len < 1 or repeats < 1:
        from deepgap.core.errors import UsageError

        raise UsageError(
            f"input length {input_len}, output length {output_len}, repeats {repeats}",
            "pass input and output lengths and repeats of at least 1",
        )
    device = model.embed_tokens.weight.device
    check_run(model.shape, batch, input_len + output_len, model.embed_tokens.weight.element_size())
    ids = prompts(model.shape.vocab, batch, input_len, seed).to(device)
    step = step or model.decode_step
    model.setup_cache(batch, input_len + output_len)
    runs, first = [], None
    with torch.inference_mode():
        for _ in range(warmup):
            _timed_run(model, ids, output_len, _Untimed(), step, pipelined=False, fill=prefill)
        for _ in range(repeats):
            run, tokens = _timed_run(model, ids, output_len, clock, step, pipelined, prefill)
            runs.append(run)
            first = first or tokens
    tokens = torch.cat(first, dim=1).cpu().tolist()
    return DecodeResult(
        batch=batch,
        input_len=input_len,
        output_len=output_len,
        runs=tuple(runs),
        kv_cache_bytes=model.cache.nbytes,
        weight_bytes=weight_bytes(model),
        tokens=tuple(tuple(t) for t in tokens),
        warmup_runs=warmup,
    )


class _Untimed:
    """A clock that only runs the work (warm-up generations)."""

    def time_iteration(self, step) -> float:
        step()
        return 0.0

    def time_window(self, step, n: int) -> float:
        for _ in range(n):
            step()
        return 0.0
