"""The KV cache as fp8 codes (`deepgap.measure.models.llama_cache`, ``--kv-caches fp8``).

On the CPU the decode attention kernel and the RoPE GEMV run in Triton's interpreter: each reads or writes the
codes as the torch path does (`StaticKVCache.encode`, `decode`), and llama-tiny decodes through the codes within
a few percent of its bf16 cache.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from deepgap.measure.models.llama_cache import FP8_CODES, FP8_MAX, StaticKVCache
from deepgap.measure.models.llama_config import SHAPES
from deepgap.measure.quant.rope_store import e4m3_rne


@triton.jit
def _cast(x_ptr, o_ptr, N: tl.constexpr):  # noqa: N803 - Triton's capitals
    r = tl.arange(0, N)
    tl.store(o_ptr + r, e4m3_rne(tl.load(x_ptr + r).to(tl.float32)).to(o_ptr.dtype.element_ty))


def _cache(codes=FP8_CODES, dtype=torch.bfloat16) -> StaticKVCache:
    return StaticKVCache(SHAPES["llama-tiny"], 2, 8, dtype, "cpu", codes)


def test_codes_saturate_at_e4m3s_range_and_read_back_as_the_models_dtype():
    cache = _cache()
    t = torch.tensor([1000.0, -1000.0, 1.3, -0.0137]).bfloat16()
    codes = cache.encode(t)
    assert codes.dtype == FP8_CODES and not codes.float().isnan().any()  # a plain cast past 448 is NaN
    assert codes.float().tolist()[:3] == [FP8_MAX, -FP8_MAX, 1.25]
    back = cache.decode(codes)
    assert back.dtype == torch.bfloat16 and back.float().tolist() == codes.float().tolist()
    plain = _cache(codes=None)
    assert plain.encode(t) is t and plain.decode(t) is t  # the model's dtype: nothing changes
    assert plain.k[0].dtype == torch.bfloat16 and cache.k[0].dtype == FP8_CODES
    assert plain.nbytes == 2 * cache.nbytes


@pytest.mark.parametrize("split", ["off", "on"])
def test_the_attention_kernel_reads_the_codes_as_bf16(split, monkeypatch):
    """The kernel over fp8 K and V equals the reference over the same codes read back as bf16."""
    from deepgap.measure.llm_attention import decode_attention, reference

    monkeypatch.setenv("DEEPGAP_DECODE_SPLIT_KV", split)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 8, 1, 32, generator=g).bfloat16()
    k, v = (torch.randn(2, 2, 100, 32, generator=g).mul(3).to(FP8_CODES) for _ in range(2))
    got = decode_attention(q, k, v, torch.tensor([70]))
    want = reference(q, k.bfloat16(), v.bfloat16(), 70)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_the_rope_gemv_writes_the_codes_of_its_bf16_rows():
    """The qkv GEMV with RoPE stores into an fp8 cache the codes of what it stores into a bf16 one."""
    from deepgap.measure.quant.gemv import GemvTile
    from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, fused_gemv

    nq, nkv, d, k_in, length = 4, 2, 16, 128, 8
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, k_in, generator=g).bfloat16()
    codes = (torch.randn((nq + 2 * nkv) * d, k_in, generator=g) * 40).clamp(-120, 120).to(FP8_CODES)
    scale = (torch.rand(codes.shape[0], generator=g) + 0.5) / 2  # rows past ±448: some saturate
    half = torch.rand(d // 2, generator=g) * 6
    cos, sin = (f(torch.cat([half, half])).bfloat16()[None] for f in (torch.cos, torch.sin))
    rows = {}
    for dtype in (torch.bfloat16, FP8_CODES):
        kv = [torch.zeros(1, nkv, length, d, dtype=dtype) for _ in range(2)]
        fusion = Fusion(rope=RopeWrite(cos, sin, torch.tensor([5]), kv[0], kv[1], nq))
        q = fused_gemv(x, codes, scale, fusion, GemvTile(8, 64, 1, 4, 3))
        rows[dtype] = (q, *kv)
    cache = _cache()
    q16, k16, v16 = rows[torch.bfloat16]
    q8, k8, v8 = rows[FP8_CODES]
    assert torch.equal(q8, q16)  # q goes on in bf16 either way
    assert k16.abs().max() > FP8_MAX or v16.abs().max() > FP8_MAX  # the clamp is exercised
    for got, bf16 in ((k8, k16), (v8, v16)):
        assert got.dtype == FP8_CODES
        assert torch.equal(got.float(), cache.encode(bf16).float())


def test_llama_tiny_decodes_through_fp8_codes_close_to_its_bf16_cache(monkeypatch):
    """llama-tiny in fp8 with the RoPE GEMV: the eager step (an int position) and the static one (a tensor
    position, the attention kernel) over an fp8 cache, against the same weights over a bf16 cache."""
    from graphed_tiny import prefill_both

    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.llm_attention import decode_attention
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.models.llama_net import build_llama

    monkeypatch.setenv("DEEPGAP_DECODE_ROPE", "fused")
    coded = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0, device="cpu"))
    coded.kv_codes = FP8_CODES
    plain = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0, device="cpu"))
    for m in (coded, plain):
        m.static_attention = decode_attention  # what `llm_steps` plugs in on a GPU
    tok = prefill_both(coded, plain)
    assert coded.cache.k[0].dtype == FP8_CODES and plain.cache.k[0].dtype == torch.bfloat16
    with torch.inference_mode():
        for kind, position in (("eager", 6), ("static", 7)):
            a, b = (make_step(m, kind)(tok, position).float() for m in (coded, plain))
            rel = float((a - b).norm() / b.norm())
            assert rel < 0.05, (position, rel)
            tok = b.argmax(-1, keepdim=True)
    assert coded.cache.k[0][0, :, 7].float().abs().sum() > 0  # the static step wrote its codes


def test_the_interpreters_rounding_gives_torchs_codes_for_every_bf16_value():
    """`rope_store.e4m3_rne` then the cast, in Triton's interpreter: the code torch's cast gives (a GPU's
    ``cvt.rn.satfinite``), for every finite bf16 value within ±448, subnormals and ties included."""
    from deepgap.measure.quant.launch import launcher

    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = x[x.float().abs() <= FP8_MAX]
    n = triton.next_power_of_2(x.numel())
    x = torch.cat([x, torch.zeros(n - x.numel(), dtype=torch.bfloat16)])
    out = torch.empty(n, dtype=FP8_CODES)
    launcher(_cast, x.device)[(1,)](x, out, N=n)
    assert torch.equal(out.float(), x.to(FP8_CODES).float())  # as values: a zero's sign aside


def test_a_decode_sweep_measures_each_cache_and_holds_fp8_to_fp8s_bounds(tmp_path):
    """``deepgap run --workload decode --kv-caches auto,fp8`` on the CPU: two rows of their own, the fp8 one's
    cache a quarter of fp32's bytes, checked against fp32 and held to fp8's bounds (fp32's would flag it)."""
    from clirun import deepgap_cli

    from deepgap.store import Store

    store = tmp_path / "kv.sqlite"
    r = deepgap_cli(
        "run", "--workload", "decode", "--models", "llama-tiny", "--device", "cpu", "--engines", "eager",
        "--precisions", "fp32", "--batch-sizes", "1", "--input-lens", "16", "--output-lens", "4",
        "--kv-caches", "auto,fp8", "--sweeps", "1", "--no-cpu-baseline", "--no-thermal-warmup", "--store", str(store),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    df = Store(str(store)).decode_frame().set_index("kv_cache")
    assert sorted(df.index) == ["", "fp8"] and (df.status == "ok").all()
    auto, fp8 = df.extra[""], df.extra["fp8"]
    assert fp8.decode.kv_cache_bytes * 4 == auto.decode.kv_cache_bytes
    assert auto.correctness.rel_l2 == 0 and 0 < fp8.correctness.rel_l2 < fp8.correctness.bound_rel_l2 == 0.25
    assert not fp8.correctness.flagged


@pytest.mark.gpu
def test_on_the_gpu_the_kernels_write_and_read_the_codes_at_the_8b_shape():
    """Llama-3.1-8B's qkv (4096 → 6144) with RoPE into an fp8 cache: the codes of the bf16 rows, bit for bit
    (the GPU's cast against torch's); the attention over 300 cached positions of codes against the reference."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run through the device machine)")
    from deepgap.measure.llm_attention import decode_attention, reference
    from deepgap.measure.quant.gemv_fused import Fusion, RopeWrite, fused_gemv

    dev, nq, nkv, d, k_in, length = "cuda", 32, 8, 128, 4096, 300
    g = torch.Generator(device=dev).manual_seed(5)
    x = torch.randn(1, k_in, generator=g, device=dev).bfloat16()
    codes = (
        torch.randn((nq + 2 * nkv) * d, k_in, generator=g, device=dev).mul(60).clamp(-440, 440).to(FP8_CODES)
    )
    scale = torch.full(((nq + 2 * nkv) * d,), 0.02, device=dev)
    cos, sin = torch.ones(1, d, device=dev).bfloat16(), torch.zeros(1, d, device=dev).bfloat16()
    kept = {}
    for dtype in (torch.bfloat16, FP8_CODES):
        kv = [torch.zeros(1, nkv, length, d, dtype=dtype, device=dev) for _ in range(2)]
        fused_gemv(x, codes, scale, Fusion(rope=RopeWrite(cos, sin, torch.tensor([9], device=dev), *kv, nq)))
        kept[dtype] = kv
    encode = StaticKVCache(SHAPES["llama-tiny"], 1, 1, torch.bfloat16, dev, FP8_CODES).encode
    for got, bf16 in zip(kept[FP8_CODES], kept[torch.bfloat16], strict=True):
        assert torch.equal(got.view(torch.uint8), encode(bf16).view(torch.uint8))
    q = torch.randn(1, nq, 1, d, generator=g, device=dev).bfloat16()
    k, v = (torch.randn(1, nkv, length, d, generator=g, device=dev).mul(3).to(FP8_CODES) for _ in range(2))
    got = decode_attention(q, k, v, torch.tensor([299], device=dev))
    torch.testing.assert_close(
        got.float(), reference(q, k.bfloat16(), v.bfloat16(), 299).float(), rtol=2e-2, atol=2e-2
    )
