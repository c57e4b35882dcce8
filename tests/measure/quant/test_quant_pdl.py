"""Programmatic dependent launch for the quant kernels (`quant.launch.pdl`, `quant.pdl_choice`) on the CPU.

The GPU side (both graphs give the same logits, the choice is timed) runs in
tests/measure/quant/test_quant_gpu.py; here: the launch keywords, the code a PDL kernel compiles to for sm_90
(ahead of time, no GPU), and the modes.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from sm90 import compile_sm90  # noqa: E402

from deepgap.measure.quant import kernels, launch  # noqa: E402
from deepgap.measure.quant.pdl_choice import choose_pdl  # noqa: E402


class FakeKernel:
    def __init__(self, calls):
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *a, **k: self.calls.append(("run", grid, a, k))

    def warmup(self, *a, grid, **k):
        self.calls.append(("warmup", grid, a, k))


def test_inside_pdl_gpu_launches_carry_the_constexpr_and_the_launch_option():
    calls = []
    gpu = torch.device("cuda")
    with launch.pdl():
        launch.launcher(FakeKernel(calls), gpu)[(2,)](1, BM=32)
        with launch.compile_only():
            launch.launcher(FakeKernel(calls), gpu)[(3,)](2)
        assert isinstance(launch.launcher(kernels.epilogue_kernel, torch.device("cpu")), launch.Interpreted)
    launch.launcher(FakeKernel(calls), gpu)[(1,)](3)  # outside: as before
    pdl = {"PDL": 2, "launch_pdl": True}  # `gdc.LATE`, the default since session 55
    assert calls == [
        ("run", (2,), (1,), {"BM": 32, **pdl}),
        ("warmup", (3,), (2,), pdl),
        ("run", (1,), (3,), {}),
    ]


def test_the_trigger_switch_picks_the_early_constexpr(monkeypatch):
    """``DEEPGAP_PDL_TRIGGER=early``: the kernels' ``PDL`` is `gdc.EARLY`; a bad value stops with the fix."""
    from deepgap.core.errors import UsageError
    from deepgap.measure.quant import gdc

    calls = []
    monkeypatch.setenv("DEEPGAP_PDL_TRIGGER", "early")
    with launch.pdl():
        assert launch.pdl_on()
        launch.launcher(FakeKernel(calls), torch.device("cuda"))[(1,)](0)
    assert (
        calls == [("run", (1,), (0,), {"PDL": gdc.EARLY.value, "launch_pdl": True})] and not launch.pdl_on()
    )
    monkeypatch.setenv("DEEPGAP_PDL_TRIGGER", "lately")
    with pytest.raises(UsageError, match="DEEPGAP_PDL_TRIGGER"), launch.pdl():
        pass


def _epilogue_ptx(pdl: int) -> str:
    sig = {
        "x_ptr": "*fp16",
        "out_ptr": "*i8",
        "alpha_ptr": "*fp32",
        "beta_ptr": "*fp32",
        "res_ptr": "*i8",
        "gamma": "fp32",
        "M": "i32",
        "N": "i32",
    }
    const = dict(RELU=True, HAS_RES=True, OUT_KIND=kernels.OUT_KIND["int8"], BM=64, BN=64, PDL=pdl)
    return compile_sm90(kernels.epilogue_kernel, sig, const, num_warps=4).asm["ptx"]


def test_a_pdl_kernel_waits_for_its_predecessor_before_touching_memory():
    """sm_90 code: griddepcontrol.launch_dependents and .wait come before the first global load or store."""
    ptx = _epilogue_ptx(1)
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("griddepcontrol.launch_dependents") < wait
    assert wait < ptx.index("ld.global") and wait < ptx.index("st.global")
    assert "griddepcontrol" not in _epilogue_ptx(0)


def test_with_the_late_trigger_a_kernel_lets_the_next_launch_only_after_its_wait():
    """`gdc.LATE` (``DEEPGAP_PDL_TRIGGER=late``): .wait, then .launch_dependents, both before any load or store;
    the fused decode GEMV keeps its first weights' loads before the wait (its GPU twin, the same bits either way:
    tests/measure/quant/test_gemv_in_thread.py)."""
    from deepgap.measure.quant import gdc
    from deepgap.measure.quant.gemv_fused import fused_row_kernel

    ptx = _epilogue_ptx(gdc.LATE.value)
    wait, launch_ = ptx.index("griddepcontrol.wait"), ptx.index("griddepcontrol.launch_dependents")
    assert wait < launch_ < ptx.index("ld.global") and launch_ < ptx.index("st.global")
    sig = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", scale_ptr="*fp32", gamma_ptr="*bf16", res_ptr="*bf16",
               out_ptr="*bf16", NO="i32", K="i32", eps="fp32")  # fmt: skip
    const = dict(NORM=False, SWIGLU=False, RESIDUAL=True, ROPE=False, REDUCE=2, BN=8, BK=2048, PRE=1)
    loads = {}
    for pdl in (gdc.EARLY.value, gdc.LATE.value):
        ptx = compile_sm90(
            fused_row_kernel, sig, const | {"PDL": pdl}, ("x_ptr", "w_ptr", "K"), num_warps=8
        ).asm["ptx"]
        wait, launch_ = ptx.index("griddepcontrol.wait"), ptx.index("griddepcontrol.launch_dependents")
        assert (launch_ < wait) == (pdl == gdc.EARLY.value)
        loads[pdl] = (ptx[:wait].count("ld.global"), ptx.count("ld.global"))
    assert loads[gdc.EARLY.value] == loads[gdc.LATE.value] and loads[gdc.LATE.value][0] > 0


def test_pdl_modes():
    sentinel = object()
    assert choose_pdl(None, sentinel, torch.zeros(1), "cpu", "off") == (sentinel, None)  # nothing timed
    with pytest.raises(ValueError, match="pdl must be one of"):
        choose_pdl(None, sentinel, torch.zeros(1), "cpu", "always")
