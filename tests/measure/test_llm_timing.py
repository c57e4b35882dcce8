"""Decode measurement (issue 51): TTFT/TPOT/tokens/s arithmetic on a scripted clock, the tail rule, memory,
the static decode step, and the analytic bytes and FLOPs per token that place decode on the roofline.

The model is the tiny Llama on the CPU (milliseconds); the clock hands out scripted durations while the
model really runs, so every figure is checked exactly and no test reads the wall clock.
"""

import math

import pytest
import torch

from deepgap.measure.llm_cost import Itemsizes, decode_cost, gemm_weights, prefill_cost
from deepgap.measure.llm_steps import make_step
from deepgap.measure.llm_timing import P99_MIN_N, DecodeResult, DecodeRun, generate, measure_decode, prompts
from deepgap.measure.models.llama_config import SHAPES
from deepgap.measure.models.llama_net import build_llama, weight_bytes


class ScriptedClock:
    """Runs the work and returns the next scripted duration; records how it was called."""

    def __init__(self, iteration_s, window_s=1.0):
        self.iteration_s, self.window_s, self.calls = list(iteration_s), window_s, []

    def time_iteration(self, step):
        step()
        self.calls.append("iteration")
        return self.iteration_s.pop(0)

    def time_window(self, step, n):
        for _ in range(n):
            step()
        self.calls.append(("window", n))
        return self.window_s


@pytest.fixture(scope="module")
def tiny():
    return build_llama("llama-tiny", seed=0)


def test_figures_on_a_scripted_clock(tiny):
    # two runs of batch 3, 5 prompt tokens, 4 output tokens: a prefill and 3 decode steps each
    # (the fifth iteration of a run is the pipelined window's prefill: synchronized through the clock, unused)
    script = [0.5, 0.1, 0.2, 0.3, 9.0] + [0.7, 0.1, 0.1, 0.4, 9.0]
    clock = ScriptedClock(script, window_s=0.15)
    r = measure_decode(tiny, 3, 5, 4, clock, repeats=2, warmup=1)
    # warm-up untimed; the window follows a synchronized prefill, so its energy holds no prefill
    assert clock.calls == (["iteration"] * 5 + [("window", 3)]) * 2
    s = r.summary()
    assert (s["ttft_median_s"], s["ttft_n"]) == (0.6, 2)
    assert s["tpot_n"] == 6 and s["tpot_median_s"] == pytest.approx(0.15)
    assert (s["tpot_tail_s"], s["tpot_tail_kind"]) == (0.4, "max")  # 6 samples: no p99
    decode_s = 0.1 + 0.2 + 0.3 + 0.1 + 0.1 + 0.4
    assert s["decode_tok_s"] == pytest.approx(3 * 6 / decode_s)
    assert s["pipelined_decode_tok_s"] == pytest.approx(3 * 3 * 2 / 0.3)
    e2e = 0.5 + 0.6 + 0.7 + 0.6
    assert s["e2e_median_s"] == pytest.approx(1.2)
    assert s["output_tok_s"] == pytest.approx(3 * 4 * 2 / e2e)
    assert s["total_tok_s"] == pytest.approx(3 * 9 * 2 / e2e)
    shape = tiny.shape
    assert s["kv_cache_bytes"] == 2 * shape.layers * 3 * shape.kv_heads * 9 * shape.head_dim * 4  # fp32
    assert s["weight_bytes"] == 4 * shape.params() == weight_bytes(tiny)


def test_measured_tokens_are_the_greedy_generation(tiny):
    r = measure_decode(tiny, 2, 6, 5, ScriptedClock([0.01] * 5), repeats=1, warmup=0, pipelined=False)
    want = generate(tiny, prompts(tiny.shape.vocab, 2, 6), 5)
    assert r.tokens == tuple(tuple(t) for t in want.tolist())
    assert r.summary()["pipelined_decode_tok_s"] is None


def test_tpot_tail_is_a_p99_only_where_n_supports_it():
    from deepgap.analysis import tails

    assert P99_MIN_N == tails.P99_MIN_N == tails.min_samples(0.99) == 368

    def result(n):
        steps = tuple(float(i + 1) for i in range(n))
        return DecodeResult(1, 4, n + 1, (DecodeRun(0.0, steps),), 0, 0)

    assert result(P99_MIN_N - 1).tpot_tail() == (P99_MIN_N - 1.0, "max", P99_MIN_N - 1)
    seconds, kind, n = result(P99_MIN_N).tpot_tail()
    assert kind == "p99" and n == P99_MIN_N and seconds < P99_MIN_N
    assert DecodeResult(1, 4, 1, (DecodeRun(0.2, ()),), 0, 0).summary()["tpot_n"] == 0  # one output token


def test_static_decode_step_gives_the_eager_tokens(tiny):
    """The static-shape step (what compile and CUDA graphs capture) equals the eager one, token for token."""
    ids = prompts(tiny.shape.vocab, 2, 7, seed=3)
    tiny.setup_cache(2, 20)
    eager = generate(tiny, ids, 10)
    tiny.setup_cache(2, 20)
    static = generate(tiny, ids, 10, step=make_step(tiny, "static"))
    assert torch.equal(eager, static)


def test_decode_cost_of_the_8b_shape_in_fp8_at_batch_1_is_bandwidth_bound_near_640_tok_s():
    """Issue 51's anchor: ≈ 8 GB read per token, ≈ 600 tok/s on an H200's 4.8 TB/s."""
    shape = SHAPES["llama-3.1-8b"]
    c = decode_cost(shape, batch=1, context=128, sizes=Itemsizes(linear=1, other=1, kv=2))
    embedding = shape.vocab * shape.hidden
    assert c.weight_bytes == shape.params() - embedding + shape.hidden  # one embedding row read
    assert 7.4e9 < c.bytes_per_token < 7.6e9
    assert c.kv_bytes == 129 * 2 * 32 * 8 * 128 * 2  # 129 tokens' K and V, bf16
    assert 620 < c.bound_tokens_per_s(4.8e12) < 645
    assert c.flops_per_token == pytest.approx(2 * gemm_weights(shape) + 4 * 32 * 32 * 128 * 129)
    assert 1.95 < c.intensity < 2.05  # 2 FLOPs per fp8 weight byte: far below any GPU's ridge point


def test_decode_cost_shares_the_weights_across_the_batch_and_grows_with_context():
    shape = SHAPES["llama-3.2-1b"]  # tied: the head reads the whole embedding matrix
    one, big = decode_cost(shape, 1, 512), decode_cost(shape, 64, 512)
    assert one.weight_bytes == big.weight_bytes == 2 * shape.params()
    assert big.bytes_per_token < one.bytes_per_token / 10
    assert big.kv_bytes == 64 * one.kv_bytes
    long = decode_cost(shape, 64, 8192)
    assert long.kv_bytes > long.weight_bytes  # at batch 64 and 8k context the cache dominates
    # the compute ceiling binds at a large batch when peak/bandwidth is low
    assert big.bound_tokens_per_s(4.8e12, peak_flops=1e12) == pytest.approx(64 * 1e12 / big.flops)


def test_prefill_cost_counts_causal_attention():
    shape = SHAPES["llama-tiny"]
    c = prefill_cost(shape, batch=2, input_len=8)
    h, layers = shape.hidden, shape.layers
    gemm = gemm_weights(shape) - shape.vocab * h
    attention = 4 * 2 * layers * shape.heads * shape.head_dim * (8 * 9 // 2)
    assert c.flops == 2 * 2 * 8 * gemm + 2 * 2 * shape.vocab * h + attention
    assert c.tokens == 16 and math.isclose(c.flops_per_token, c.flops / 16)


def test_bf16_copy_keeps_fp32_angles_and_close_logits():
    """A cast to bf16 leaves RoPE's inverse frequencies in fp32 (as HF's), so only the weights round."""
    ref = build_llama("llama-tiny", seed=2)
    low = build_llama("llama-tiny", seed=2).to(torch.bfloat16)
    assert low.inv_freq.dtype == torch.float32 and torch.equal(low.inv_freq, ref.inv_freq)
    ids = prompts(ref.shape.vocab, 2, 16, seed=1)
    with torch.inference_mode():
        want, got = ref(ids, all_logits=True), low(ids, all_logits=True).float()
    assert float((got - want).norm() / want.norm()) < 3e-2
    assert low.setup_cache(2, 20).k[0].dtype == torch.bfloat16


def test_greedy_is_argmax_first_of_equal_maxima_with_nans():
    """`chunked_argmax` (the batch-1 GPU path of `greedy`) equals ``argmax(-1)``: ties, a NaN, bf16, 1-8 rows."""
    from deepgap.measure.llm_timing import GREEDY_CHUNKS, chunked_argmax, greedy

    g = torch.Generator().manual_seed(0)
    vocab = 128_256  # Llama-3's: 256 chunks of 501
    for rows in (1, 3, 8):
        x = torch.randn(rows, vocab, generator=g).to(torch.bfloat16)
        x[0, 7] = x[0, 90_000] = x[0, 100_000] = 9.0  # equal maxima in two chunks and one: the first wins
        if rows > 1:
            x[1, 5_000] = float("nan")  # argmax takes a NaN as the largest
        want = x.argmax(-1, keepdim=True)
        for chunks in GREEDY_CHUNKS:
            assert torch.equal(chunked_argmax(x, chunks), want), (rows, chunks)
        assert torch.equal(greedy(x), want)  # on the CPU: the plain argmax
    assert int(chunked_argmax(x, 256)[0]) == 7
