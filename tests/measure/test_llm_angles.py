"""RoPE's angles in one kernel (`llm_angles`, ``DEEPGAP_DECODE_ANGLES=kernel``), held to the model's formula.

On the CPU the kernel (`compute`) runs in Triton's interpreter, whose cos and sin (numpy's) may part from
torch's by one fp32 ulp: the tests allow one step of the output dtype. The op itself runs the formula on CPU
tensors, so the CPU step tests check the op's plumbing (one extern call every layer reads); the GPU test holds
the compiled, graphed fused step with the kernel's angles to the default step's logits.
"""

from __future__ import annotations

import pytest
import torch

from deepgap.measure.llm_angles import compute, reference, rope_angles
from deepgap.measure.models.llama_config import SHAPES, inv_frequencies


def _ulps(dtype: torch.dtype) -> float:
    return {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 2**-23}[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_kernel_gives_the_models_angles(dtype):
    inv = torch.tensor(inv_frequencies(SHAPES["llama-3.1-8b"]), dtype=torch.float32)  # 64 of them, rescaled
    pos = torch.tensor([0, 1, 7, 255, 4096, 131_071])
    for got, want in zip(compute(pos, inv, dtype), reference(pos, inv, dtype), strict=True):
        assert got.shape == (6, 128) and got.dtype == dtype
        assert bool(((got.float() - want.float()).abs() <= _ulps(dtype) * 2).all())
    cos, sin = compute(pos[:1], inv, dtype)
    assert torch.equal(cos, torch.ones_like(cos)) and torch.equal(sin, torch.zeros_like(sin))  # position 0


def test_on_cpu_tensors_the_op_is_the_formula(monkeypatch):
    """A CPU serve's steps call the op every token: torch's formula, not the interpreter (session 53)."""
    from deepgap.measure import llm_angles

    def launched(*args):
        raise AssertionError("the kernel was launched on CPU tensors")

    monkeypatch.setattr(llm_angles, "compute", launched)  # what the op's CUDA implementation calls
    inv = torch.tensor(inv_frequencies(SHAPES["llama-3.2-1b"]), dtype=torch.float32)
    pos = torch.tensor([3, 200])
    for got, want in zip(
        rope_angles(pos, inv, torch.bfloat16), reference(pos, inv, torch.bfloat16), strict=True
    ):
        assert torch.equal(got, want)


def test_a_row_says_where_its_angles_came_from():
    """`Decode.angles`: "one kernel" only where the op is plugged and the model is on a GPU (session 53)."""
    from types import SimpleNamespace

    from deepgap.analysis.decode import figures
    from deepgap.measure.llm_angles import describe

    def model(device, fn):
        return SimpleNamespace(
            embed_tokens=SimpleNamespace(weight=torch.empty(0, device=device)), angle_fn=fn
        )

    on_gpu = SimpleNamespace(
        embed_tokens=SimpleNamespace(weight=SimpleNamespace(device=torch.device("cuda")))
    )
    assert describe(SimpleNamespace(**vars(on_gpu), angle_fn=rope_angles)) == "one kernel"
    assert describe(SimpleNamespace(**vars(on_gpu), angle_fn=None)) == "formula"
    assert describe(model("cpu", rope_angles)) == "formula"  # on CPU tensors the op runs the formula
    assert describe(model("cpu", None)) == "formula"
    assert "decode_angles" in figures({"status": "skipped"})  # kept on every row, like decode_tiles


def test_the_switch_plugs_the_kernel_into_a_fused_decoder(monkeypatch):
    from deepgap.measure import llm_fused
    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.models.llama_net import build_llama

    for name in ("DEEPGAP_DECODE_ROPE", "DEEPGAP_DECODE_ANGLES"):
        monkeypatch.delenv(name, raising=False)
    model = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0))
    assert model.angle_fn is rope_angles  # the default since session 53 (timed on an H200): one kernel
    for rope, angles, plugged in (
        ("fused", "kernel", True),
        ("mix", "kernel", False),
        ("fused", "inductor", False),
    ):
        monkeypatch.setenv("DEEPGAP_DECODE_ROPE", rope)
        monkeypatch.setenv("DEEPGAP_DECODE_ANGLES", angles)
        llm_fused.configure(model)
        assert (model.angle_fn is rope_angles) == plugged, (rope, angles)
    plain = build_llama("llama-tiny", seed=0)
    llm_fused.configure(plain)  # no fused layer: nothing plugged
    assert plain.angle_fn is None


def test_a_fused_step_with_the_kernels_angles_gives_the_same_logits(monkeypatch):
    """llama-tiny in fp8, batch 1: the eager and static steps with the kernel's angles against Inductor's formula."""
    from graphed_tiny import prefill_both

    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.models.llama_net import build_llama

    monkeypatch.setenv("DEEPGAP_DECODE_ANGLES", "kernel")
    kernel = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0))
    monkeypatch.setenv("DEEPGAP_DECODE_ANGLES", "inductor")
    formula = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0))
    assert kernel.angle_fn is rope_angles and formula.angle_fn is None
    tok = prefill_both(kernel, formula)
    with torch.inference_mode():
        for kind, position in (("eager", 6), ("static", 7)):
            a, b = (make_step(m, kind)(tok, position).float() for m in (kernel, formula))
            assert float((a - b).norm() / b.norm()) < 0.01, (kind, position)
            tok = b.argmax(-1, keepdim=True)


@pytest.mark.gpu
def test_the_graphed_step_with_the_kernels_angles_gives_the_default_logits(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run through the device machine)")
    from graphed_tiny import fp8_graph_logits

    inv = torch.tensor(inv_frequencies(SHAPES["llama-3.1-8b"]), dtype=torch.float32, device="cuda")
    pos = torch.arange(0, 4096, 37, device="cuda")
    for got, want in zip(
        rope_angles(pos, inv, torch.bfloat16), reference(pos, inv, torch.bfloat16), strict=True
    ):
        assert bool(((got.float() - want.float()).abs() <= 2**-7).all())
    logits = {}
    for mode in ("inductor", "kernel"):
        monkeypatch.setenv("DEEPGAP_DECODE_ANGLES", mode)
        logits[mode], model = fp8_graph_logits(logits.get("inductor"))
        assert (model.angle_fn is rope_angles) == (mode == "kernel")
    for i in range(4):
        a, b = logits["kernel"][i], logits["inductor"][i]
        assert float((a - b).norm() / b.norm()) < 0.01, i
