"""The decode step as each engine runs it: eager, static-shape, torch.compile, and a CUDA graph replay.

Each returns a ``step(ids, position: int) -> logits`` for `deepgap.measure.llm_timing.measure_decode`.

- **eager**: ``model.decode_step(ids, position)`` with an int position: attention reads only the
  positions written so far.
- **static**: the position as a device tensor, attention over the whole cache with a mask. Every step
  has the same shapes and no host value, which is what compiling and graph capture need; it reads the
  whole cache each step (``max_len`` rather than ``position + 1`` keys), so it is slower eager; on a GPU
  in half precision its attention is `deepgap.measure.llm_attention`'s kernel, which reads only the
  positions written (set here as the model's ``static_attention``).
- **compile**: ``torch.compile`` of the static step (``mode`` as given; "max-autotune-no-cudagraphs"
  or "default" leave graphs to the next one).
- **cuda-graph**: the static step (optionally compiled) captured once into a ``torch.cuda.CUDAGraph``
  on fixed input buffers, then replayed: one launch per token instead of several hundred kernels'.

The prefill as each engine runs it (`make_prefill`): an engine that compiles its step (``compile*``, ``quant``)
compiles its prefill too, for the configuration's fixed (batch, input length); the others run it eager.
Why: eager, every RMSNorm, RoPE, SwiGLU, residual add and (quant) per-token activation quantization of the
prompt is its own pass over a (batch × input length) × hidden tensor (at batch 512 of 128 tokens, 0.5 GB a
pass at the 8B shape, 3.8 GB for gate_up's output), which Inductor fuses into the GEMMs' neighbours. A
row's ``decode.prefill`` says which ran. ``DEEPGAP_DECODE_PREFILL=eager`` keeps it eager (the A/B).

All four give the same tokens (`tests/measure/test_llm_timing.py` checks eager against static on the CPU;
the compiled and graph steps are GPU work for ``benchmarks/llm_decode.py``).
"""

from __future__ import annotations

import contextlib

import torch

from deepgap.core import switches
from deepgap.core.errors import UsageError
from deepgap.measure.llm_timing import greedy
from deepgap.measure.quant.linear import row_kernel_on
from deepgap.measure.quant.pdl_choice import decode_modes

STEPS = ("eager", "static", "compile", "cuda-graph")


def make_step(model, kind: str, compile_mode: str = "max-autotune-no-cudagraphs", compiled: bool = False):
    """The ``step(ids, position)`` for ``kind`` (one of `STEPS`); the model's cache must be set up."""
    if kind not in STEPS:
        raise UsageError(f"unknown decode step {kind!r}", f"choose one of: {', '.join(STEPS)}")
    if kind == "eager":
        return model.decode_step
    from deepgap.measure import llm_attention

    llm_attention.plug(model)  # the static step's attention: the kernel that reads only the written positions
    if kind == "static":
        return _StaticStep(model, model.decode_step)
    if kind == "compile":
        return _StaticStep(model, torch.compile(model.decode_step, mode=compile_mode, dynamic=False))
    return _GraphStep(model, compile_mode if compiled else None)


def feed_tail(logits, ids, pos):
    """What a graph step captures after its logits: the greedy tokens, fed to its own input, and the next position.

    The step's input then holds the token and its position tensor the next position, so a replay follows
    the last with no kernel between them (`_GraphStep.next_token`, `llm_timing.token_step`).
    """
    tok = greedy(logits)
    ids.copy_(tok)
    pos.add_(1)
    return tok


class Prefill:
    """``prefill(ids) -> logits`` as the engine runs it, and the label its row stores (``decode.prefill``)."""

    def __init__(self, fn, label: str) -> None:
        self.fn, self.label = fn, label

    def __call__(self, ids):  # noqa: D102
        return self.fn(ids)


def prefill_compiles(compile_mode: str | None) -> bool:
    """Whether an engine that compiles its step in ``compile_mode`` (None: it does not) compiles its prefill.

    The one rule for the sweep's prefill (`make_prefill`) and serve's packed admissions
    (`deepgap.serving.worker.llm_engines.packed_prefill`): yes, unless ``DEEPGAP_DECODE_PREFILL=eager``.
    """
    return compile_mode is not None and switches.read("DEEPGAP_DECODE_PREFILL") != "eager"


def make_prefill(model, compile_mode: str | None) -> Prefill:
    """The model's prefill compiled in ``compile_mode`` (an engine that compiles its step), else eager.

    Static shapes: one compile per (batch, input length), built by the run's warm-up generation, never in
    a timed one (`deepgap.measure.decode_config`). ``DEEPGAP_DECODE_PREFILL=eager`` keeps it eager.
    """
    if not prefill_compiles(compile_mode):
        why = [] if compile_mode is None else ["DEEPGAP_DECODE_PREFILL=eager"]
        if row_kernel_on(model):  # `quant.row_quant`, on a GPU
            why.append("8-bit inputs by the row kernel")
        return Prefill(model.prefill, "eager" + (f" ({'; '.join(why)})" if why else ""))
    return Prefill(
        torch.compile(model.prefill, mode=compile_mode, dynamic=False), f"compiled ({compile_mode})"
    )


class _StaticStep:
    """Calls ``fn(ids, position_tensor)``, the position copied into one preallocated device tensor."""

    def __init__(self, model, fn) -> None:
        self.fn = fn
        self.pos = torch.zeros(1, dtype=torch.int64, device=model.embed_tokens.weight.device)

    def __call__(self, ids, position: int):
        self.pos.fill_(position)
        return self.fn(ids, self.pos)


class _GraphStep:
    """A CUDA graph of the static step, captured on the first call (after warm-up on a side stream).

    Why capture lazily: capture needs the cache and the batch that the run set up, which exist only
    once ``measure_decode`` has called ``setup_cache``. The graph is bound to that cache's tensors:
    a new ``setup_cache`` (another batch or length) needs a new step.
    """

    def __init__(self, model, compile_mode: str | None) -> None:
        if not torch.cuda.is_available() or model.embed_tokens.weight.device.type != "cuda":
            raise UsageError(
                "the cuda-graph decode step needs the model on a CUDA device",
                "decode on a CPU with --engines eager",
            )
        self.model, self.graph, self.cache = model, None, None
        self.pdl: str | None = None  # the kept graph's launch and why (`_kept`), once captured
        # what the last replay left in the step's input and position tensor (`next_token`): its token, as
        # returned, and the next position; None: the input must be set
        self.fed: tuple = (None, None)
        fn = model.decode_step
        self.fn = torch.compile(fn, mode=compile_mode, dynamic=False) if compile_mode else fn

    def _capture(self, ids, position: int) -> None:
        from deepgap.measure.quant import gemv_fused, launch, step_tiles

        dev = ids.device
        self.ids = ids.clone()
        self.pos = torch.full((1,), position, dtype=torch.int64, device=dev)
        modes = decode_modes(dev)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            # warm-up (and compile) outside the capture, at the step's own position and input: it writes
            # the K and V that the real step writes, so the prompt's cache is left as it was; each launch
            # mode once more, so that its kernels are built before capture
            for i in range(3 + len(modes)):
                with launch.pdl() if modes[i % len(modes)] else contextlib.nullcontext():
                    self.fn(self.ids, self.pos)
        torch.cuda.current_stream(dev).wait_stream(side)
        if step_tiles.on():  # each fused GEMV shape's tiles timed in this step's graph (`quant.step_tiles`)
            run = lambda: self.fn(self.ids, self.pos)  # noqa: E731 - the step on its fixed input and position
            gemv_fused.tiles_in_step(lambda: step_tiles.graph_ms(run, dev, True in modes))
        graphs = {}
        for on in modes:
            g = torch.cuda.CUDAGraph()
            pool = next(iter(graphs.values()))[0].pool() if graphs else None
            with launch.pdl() if on else contextlib.nullcontext(), torch.cuda.graph(g, pool=pool):
                logits = self.fn(self.ids, self.pos)
                graphs[on] = (g, logits, feed_tail(logits, self.ids, self.pos))
        start = ids.clone()

        def reset() -> None:  # each timed replay from the same input and position
            self.ids.copy_(start)
            self.pos.fill_(position)

        (self.graph, self.logits, self.tok), self.pdl = _kept(graphs, dev, reset)
        self.cache = self.model.cache
        self.fed = (None, None)

    def _replay(self, ids, position: int) -> None:
        if self.graph is None or self.cache is not self.model.cache:
            self._capture(ids, position)
        tok, at = self.fed
        if ids is not tok:
            self.ids.copy_(ids)
        if position != at:
            self.pos.fill_(position)
        self.graph.replay()

    def __call__(self, ids, position: int):
        self._replay(ids, position)
        self.fed = (None, position + 1)  # the logits' caller feeds its own tokens
        return self.logits

    def next_token(self, ids, position: int):
        """The greedy tokens after ``ids`` at ``position``, taken in the graph (`token_step`).

        Given the tokens it returned last, at the next position, the step replays with nothing before it:
        its graph fed them already. The tokens are a copy, the caller's to keep.
        """
        self._replay(ids, position)
        tok = self.tok.clone()
        self.fed = (tok, position + 1)
        return tok


def _kept(graphs: dict, dev: torch.device, reset) -> tuple[tuple, str]:
    """The graph kept and why: PDL where it was asked for, or where it is faster and gives the same logits.

    Why timed, not assumed: PDL lets each GEMV read its first weights while the previous kernel drains,
    but a waiting kernel's blocks hold SM slots during its predecessor's last wave (`pdl_choice`).
    """
    if len(graphs) == 1:  # forced, or a GPU without PDL (`pdl_choice.decode_modes`)
        on = next(iter(graphs))
        asked = switches.read("DEEPGAP_DECODE_PDL")
        why = f"DEEPGAP_DECODE_PDL={asked}" if asked != "auto" else "needs compute capability 9.0 (Hopper)"
        return graphs[on], f"{'on' if on else 'off'}: {why}"
    from deepgap.measure.quant.pdl_choice import MIN_GAIN  # the CNN engine's PDL choice: one threshold
    from deepgap.measure.quant.tuning import time_s

    outs, ms = {}, {}
    for on, (g, out, _) in graphs.items():
        reset()  # the same step at the same position and input: the logits of one replay are every replay's
        g.replay()
        outs[on] = out.clone()

        def replay(g=g) -> None:
            reset()  # the graph feeds its own input: two small copies a replay, alike for both graphs
            g.replay()

        ms[on] = time_s(replay, reps=20, device=str(dev), use_graph=False) * 1e3  # as `pdl_choice` times
    if not torch.equal(outs[True], outs[False]):
        return graphs[False], "off: the PDL graph's logits differ from the plain graph's"
    keep = ms[True] < ms[False] * (1 - MIN_GAIN)
    verdict = (
        f"{'on' if keep else 'off'}: timed {ms[True]:.4f} ms with PDL{pdl_order()}, {ms[False]:.4f} without"
    )
    return graphs[keep], verdict


def pdl_order() -> str:
    """What a decode row's PDL verdict says of each kernel's order under PDL, "" for the order before session 54.

    The trigger after the wait (`quant.gdc`), the epilogue's constants before it (`launch.constants_ahead`);
    `decode_view` reads these words back.
    """
    from deepgap.measure.quant import launch

    said = ["trigger after its wait"] if launch.trigger() == "late" else []
    if switches.read("DEEPGAP_PDL_CONSTANTS") == "ahead":
        said.append("its constants before it" if said else "constants before its wait")
    return f" (each kernel's {', '.join(said)})" if said else ""
