"""benchmarks/gemv_ceiling.py's kernel computes what each of its ``MATH`` modes says, in Triton's interpreter.

Why: the benchmark's numbers (results/h100/session40) compare the GEMV's tile with its arithmetic taken away in
steps; a mode that summed the wrong thing would time the wrong thing. Here, on the CPU: ``cvt`` is the codes'
sum, ``gemv`` and ``bits`` are Σ w·x in fp32 (``bits`` exactly for every fp8 and int8 code), the fp16 modes are
within fp16's rounding, ``load`` is the XOR of the words.
"""

from __future__ import annotations

import pytest
import torch
from repo_paths import imported_benchmark

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def ceiling():
    yield from imported_benchmark("gemv_ceiling")


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_every_math_mode_sums_what_it_says(ceiling, kind):
    from deepgap.measure.quant.launch import launcher

    torch.manual_seed(0)
    k, n = 256, 16
    w = ceiling.codes_for(n, k, kind, "cpu")
    x = torch.randn(k).bfloat16()
    want = w.float() @ x.float()
    for math in ceiling.MATHS:
        out = torch.empty(n)
        launcher(ceiling.ceiling_kernel, w.device)[(n // 4,)](x, w, out, k, BN=4, BK=64, MATH=math, PDL=False)
        if math == "load":
            words = w.view(torch.int32).reshape(n, -1)
            xor = words[:, 0].clone()
            for j in range(1, words.shape[1]):
                xor ^= words[:, j]
            assert torch.equal(out, xor.float())
        elif math == "cvt":
            torch.testing.assert_close(out, w.float().sum(1), rtol=1e-6, atol=1e-3)
        else:
            tol = 2e-3 if math.startswith("f16") else 1e-6
            assert float((out - want).abs().max() / want.abs().max()) < tol, math
