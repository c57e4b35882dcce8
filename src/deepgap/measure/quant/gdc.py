"""Grid dependency control: where a kernel launched with PDL lets the next one launch, and where it waits.

Why a module: under programmatic dependent launch (`launch.pdl`) every Triton kernel of the quant engine and
the decode step waits for its predecessor (``griddepcontrol.wait``) before it reads an activation, and lets its
successor launch (``griddepcontrol.launch_dependents``). The trigger can come first (``EARLY``, the kernels'
order from session 15 to 54, ``DEEPGAP_PDL_TRIGGER=early``) or after the wait (``LATE``, built in session 54, the
default since session 55).

With the early trigger a kernel whose programs all start at once lets its successor launch at once, whose
programs trigger at once too, so a chain of small kernels (ResNet-50's 54 at batch 1; the decode step's
attention and combine) launches many kernels ahead: their programs hold SM slots while they wait, and a GEMV's
weights loaded before its wait compete for HBM with the kernels still running (results/h100/session54: two steps
of them slowed the 8B step by 2-6%). With the late trigger a kernel launches its successor only once its own wait
is over, one kernel ahead. On an H200 (session 53) ResNet-50's batch-1 graph ran 0.291 ms with the early
trigger against 0.253 without PDL; on one H100 (session 55) 0.289 early, 0.246 late, against 0.272-0.277
without. The value is the kernels' ``PDL`` constexpr: 0 (no PDL), ``EARLY`` or ``LATE``.
"""

# ruff: noqa: N803

from __future__ import annotations

import triton
import triton.language as tl

EARLY = tl.constexpr(1)
LATE = tl.constexpr(2)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First in a kernel, before any activation is read or written: the trigger and the wait.

    After the wait the previous kernel (and so, transitively, every earlier one) has finished and its writes
    are visible.
    """
    pdl_launch(PDL)
    pdl_wait(PDL)


@triton.jit
def pdl_launch(PDL: tl.constexpr):
    """A kernel's start, before whatever it may load ahead of the wait: the early trigger."""
    if PDL == EARLY:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """The wait for the previous kernel, then the late trigger."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    if PDL == LATE:
        tl.extra.cuda.gdc_launch_dependents()
