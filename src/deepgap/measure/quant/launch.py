"""How the quant engine's Triton kernels are launched: compiled on a GPU, interpreted on the CPU.

Why a module of its own: the kernels (`kernels`, `stem_kernels`) say what runs; this says how a launch
reaches the hardware, the same for every kernel. On CPU tensors a launch runs through the Triton
interpreter for that launch only (`interpreted`), which is how the tests check every kernel without a GPU;
inside `compile_only` a GPU launch compiles its specialization and returns unrun, so the tuner can
compile a whole network's tile candidates in parallel before timing them. `check` and `check_vec` are
the argument checks every launcher shares.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import types
from collections.abc import Iterator

import torch
import triton.language as tl

INT32_LIMIT = 2**31 - 1  # the kernels index with 32-bit offsets


class Interpreted:
    """A kernel run by the Triton interpreter on CPU tensors, without setting TRITON_INTERPRET.

    With the interpreter switched on process-wide, every ``@triton.jit`` function (ours and the
    library's, such as ``tl.zeros``) is interpretable; here only this launch is, so calls to jit
    functions made from inside the kernel are routed to the interpreter for its duration, and the
    language patches those calls apply are undone afterwards (compiled kernels must not see them).
    """

    def __init__(self, kernel) -> None:
        from triton.runtime.interpreter import InterpretedFunction

        self.fn = InterpretedFunction(kernel.fn)

    def __getitem__(self, grid):
        from triton.runtime import interpreter
        from triton.runtime.jit import JITFunction

        def launch(*args, **kwargs):
            original = JITFunction.__call__
            rewritten: dict = {}  # python function → its interpretable version

            def nested(jit_fn, *a, **k):
                fn = jit_fn.fn
                if fn not in rewritten:
                    rewritten[fn] = interpreter.InterpretedFunction(fn).rewrite()
                return rewritten[fn](*a, **k)

            # Patch the language once, outside the launch's own patch scope, so that restoring in
            # reverse order leaves nothing patched (a scope opened inside the launch's would record
            # the launch's patches as "original" and put them back after the launch had undone them).
            scope = interpreter._patch_lang(_SEES_LANGUAGE)  # tl, and tl.core for the library's helpers
            JITFunction.__call__ = nested
            try:
                return self.fn[grid](*args, **kwargs)
            finally:
                JITFunction.__call__ = original
                scope.restore()

        return launch


_SEES_LANGUAGE = types.FunctionType((lambda: None).__code__, {"tl": tl, "core": tl.core})


@functools.cache
def interpreted(kernel) -> Interpreted:
    """The Triton-interpreter version of ``kernel`` (runs on CPU tensors)."""
    return Interpreted(kernel)


_COMPILE_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("deepgap_compile_only", default=False)


# inside `pdl`: the kernels' ``PDL`` constexpr, `gdc.EARLY` or `gdc.LATE` (0 outside)
_PDL: contextvars.ContextVar[int] = contextvars.ContextVar("deepgap_pdl", default=0)


class _CompileOnly:
    """``kernel[grid](...)`` that compiles the launch's specialization without running it (`compile_only`)."""

    def __init__(self, kernel, extra: dict | None = None) -> None:
        self.kernel = kernel
        self.extra = extra or {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel.warmup(*args, grid=grid, **kwargs, **self.extra)


class _WithOptions:
    """``kernel[grid](...)`` with extra launch keywords (`pdl`)."""

    def __init__(self, kernel, extra: dict) -> None:
        self.kernel = kernel
        self.extra = extra

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kwargs: launch(*args, **kwargs, **self.extra)


@contextlib.contextmanager
def pdl() -> Iterator[None]:
    """Inside: GPU launches of this module's kernels use programmatic dependent launch (Hopper and later).

    Why: at batch 1 a ResNet-50 is 54 kernels of 2–10 µs, and each waits for its predecessor to drain
    before it is even launched. With PDL each kernel lets the next one launch early
    (`griddepcontrol.launch_dependents`) and waits for the previous one's writes
    (`griddepcontrol.wait`) before it reads or writes an activation (`gdc.pdl_enter`), so launch
    latency and the previous kernel's tail overlap. A launch by torch (cuDNN, the head) between two
    kernels is an ordinary launch and keeps full ordering. Whether it pays is timed per network
    (`prepare._make_runner`). Where each kernel lets the next launch, before its wait or after it, is
    ``DEEPGAP_PDL_TRIGGER`` (`gdc`).
    """
    from deepgap.measure.quant import gdc

    token = _PDL.set((gdc.LATE if trigger() == "late" else gdc.EARLY).value)
    try:
        yield
    finally:
        _PDL.reset(token)


def trigger() -> str:
    """Where a kernel under `pdl` lets the next one launch: ``early`` (before its wait) or ``late`` (after it).

    ``DEEPGAP_PDL_TRIGGER`` (`gdc`); what the launches use and what a row says of them read it here.
    """
    from deepgap.core import switches

    return switches.read("DEEPGAP_PDL_TRIGGER")


def constants_ahead() -> bool:
    """Whether a kernel launched now loads its epilogue's constants before PDL's wait (`gdc`, inside `pdl` only).

    ``DEEPGAP_PDL_CONSTANTS=ahead``. Why: the constants (α, β, a GEMV's scales) depend on no kernel, and loaded
    after the K loop they add one memory round trip to every kernel's critical path.
    """
    from deepgap.core import switches

    return pdl_on() and switches.read("DEEPGAP_PDL_CONSTANTS") == "ahead"


def pdl_on() -> bool:
    """Whether launches here use programmatic dependent launch now (inside `pdl`)."""
    return bool(_PDL.get())


@contextlib.contextmanager
def compile_only() -> Iterator[None]:
    """Inside: GPU launches of this module's kernels compile (or submit a compile) and return unrun.

    Why: under Triton's `AsyncCompileMode` a warm-up launch submits its compile to an executor, so
    the tile candidates of a whole network can be compiled in parallel before they are timed one by
    one (`quant.precompile.precompile`). Outputs written inside are left uninitialised.
    """
    token = _COMPILE_ONLY.set(True)
    try:
        yield
    finally:
        _COMPILE_ONLY.reset(token)


def launcher(kernel, device: torch.device):
    """``kernel`` as launched on ``device``: interpreted on the CPU, compile-only inside `compile_only`.

    Inside `pdl`, GPU launches use programmatic dependent launch.
    """
    if device.type == "cpu":
        return interpreted(kernel)
    pdl = _PDL.get()
    extra = {"PDL": pdl, "launch_pdl": True} if pdl else {}  # the constexpr, Triton's option
    if _COMPILE_ONLY.get():
        return _CompileOnly(kernel, extra)
    return _WithOptions(kernel, extra) if extra else kernel


def out_size(n: int, k: int, s: int, p: int) -> int:
    """A convolution's or pooling window's output size along one axis: ``n`` in, kernel ``k``, stride, padding."""
    return (n + 2 * p - k) // s + 1


def halved_to_divide(block: int, total: int, floor: int) -> int:
    """``block`` halved until it divides ``total`` or reaches ``floor`` (a tile fitted to a shape)."""
    while total % block and block > floor:
        block //= 2
    return block


def check(cond: bool, msg: str) -> None:
    """A launch argument's check: ``ValueError(msg)`` unless ``cond``."""
    if not cond:
        raise ValueError(msg)


def check_vec(name: str, v: torch.Tensor, n: int, device: torch.device) -> None:
    """``v`` is a contiguous float32 vector of ``n`` on ``device`` (a per-channel scale or bias)."""
    check(
        v.dtype == torch.float32 and v.shape == (n,) and v.is_contiguous() and v.device == device,
        f"{name} must be a contiguous float32 vector of {n} on {device}; "
        f"got {v.dtype} {tuple(v.shape)} on {v.device}",
    )
