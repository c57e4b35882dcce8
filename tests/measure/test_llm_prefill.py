"""The prefill as each engine runs it (`deepgap.measure.llm_steps.make_prefill`): compiled where the engine
compiles its step, eager elsewhere or under ``DEEPGAP_DECODE_PREFILL=eager``; the compiled prefill gives the
eager one's logits and cache, and a decode row stores which ran and names it in every view.

The compiled prefill is Inductor's on the CPU (the tiny Llama, about 10 s to compile on two cores).
"""

import pytest
import torch

from deepgap.commands.decode_view import _engine
from deepgap.core.errors import UsageError
from deepgap.core.switches import check_environment
from deepgap.measure.decode_config import _warmup_runs
from deepgap.measure.llm_steps import make_prefill
from deepgap.measure.llm_timing import generate, measure_decode, prompts
from deepgap.measure.models.llama_net import build_llama


class FixedClock:
    """Runs the work; every iteration and window 'takes' 10 ms (no test reads the wall clock)."""

    def time_iteration(self, step):
        step()
        return 0.01

    def time_window(self, step, n):
        for _ in range(n):
            step()
        return 0.01


@pytest.fixture(scope="module")
def tiny():
    return build_llama("llama-tiny", seed=0)


def test_eager_where_the_engine_does_not_compile_or_the_switch_says_so(tiny, monkeypatch):
    p = make_prefill(tiny, None)
    assert p.label == "eager" and p.fn == tiny.prefill
    monkeypatch.setenv("DEEPGAP_DECODE_PREFILL", "eager")
    p = make_prefill(tiny, "default")
    assert p.label == "eager (DEEPGAP_DECODE_PREFILL=eager)" and p.fn == tiny.prefill
    monkeypatch.setenv("DEEPGAP_QUANT_ROW_QUANT", "triton")  # no 8-bit Linear here: nothing to name
    assert make_prefill(tiny, None).label == "eager"
    from deepgap.measure.decode_config import LINEAR_SWAPS

    quant = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0))
    assert make_prefill(quant, "default").label == "eager (DEEPGAP_DECODE_PREFILL=eager)"  # a CPU: torch ops
    from types import SimpleNamespace

    on_gpu = SimpleNamespace(  # what make_prefill reads of a model, as a GPU's quant decoder has it
        embed_tokens=SimpleNamespace(weight=SimpleNamespace(device=torch.device("cuda"))),
        modules=quant.modules,
        prefill=quant.prefill,
    )
    assert make_prefill(on_gpu, "default").label == (
        "eager (DEEPGAP_DECODE_PREFILL=eager; 8-bit inputs by the row kernel)"
    )
    monkeypatch.setenv("DEEPGAP_DECODE_PREFILL", "compile")  # a typo stops the run before it starts
    with pytest.raises(UsageError, match="DEEPGAP_DECODE_PREFILL"):
        check_environment()


def test_compiled_prefill_gives_the_eager_logits_cache_and_tokens(tiny):
    """Inductor's prefill writes the cache rows the eager one writes and returns its logits; a generation
    through it (`measure_decode`'s ``prefill``) decodes the eager generation's tokens."""
    ids = prompts(tiny.shape.vocab, 2, 12, seed=3)
    tiny.setup_cache(2, 20)
    with torch.inference_mode():
        want = tiny.prefill(ids).clone()
        k, v = tiny.cache.k[1][:, :, :12].clone(), tiny.cache.v[1][:, :, :12].clone()
        tiny.cache.k[1].zero_()
        p = make_prefill(tiny, "default")
        assert p.label == "compiled (default)" and p.fn is not tiny.prefill
        got = p(ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tiny.cache.k[1][:, :, :12], k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tiny.cache.v[1][:, :, :12], v, rtol=1e-5, atol=1e-5)
    eager = generate(tiny, ids, 6)
    r = measure_decode(tiny, 2, 12, 6, FixedClock(), repeats=1, warmup=1, seed=3, prefill=p)
    assert [list(t) for t in r.tokens] == eager.tolist() and r.warmup_runs == 1


def test_a_compiled_or_captured_step_is_always_warmed_up():
    """A compile or a graph capture never lands in a timed TTFT or TPOT, whatever the protocol's warm-up."""

    from types import SimpleNamespace

    req = SimpleNamespace(protocol=SimpleNamespace(warmup=0))

    assert _warmup_runs(req, "eager") == 0
    assert _warmup_runs(req, "compile") == _warmup_runs(req, "cuda-graph") == 1
    req.protocol.warmup = 5
    assert _warmup_runs(req, "eager") == 1


def test_views_name_a_compiled_prefill():
    """TTFT and output tokens/s count the prefill, so a compiled one is named beside the engine; rows
    stored before it existed (no ``decode_prefill``) ran it eager and read as before."""
    row = {"engine": "quant", "decode_step": "cuda-graph", "decode_pdl": "on: timed", "kv_cache": None}
    assert _engine({**row, "decode_prefill": "compiled (default)"}) == (
        "quant (cuda-graph step, PDL, compiled prefill)"
    )
    assert _engine({**row, "decode_prefill": "eager"}) == _engine(row) == "quant (cuda-graph step, PDL)"


def test_a_served_decoder_names_the_row_kernel_in_its_prefill(monkeypatch):
    """`deepgap serve`'s engine_info says how admissions prefill, and where the row kernel quantizes them."""
    from types import SimpleNamespace

    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.serving.worker.llm_setup import _prefill_label

    quant = LINEAR_SWAPS["int8"](build_llama("llama-tiny", seed=0))
    model = SimpleNamespace(
        embed_tokens=SimpleNamespace(weight=SimpleNamespace(device=torch.device("cuda"))),
        modules=quant.modules,
    )
    ex = SimpleNamespace(prefills=None, model=model)
    assert _prefill_label(ex) == "eager, unpadded (DEEPGAP_SERVE_PREFILL=padded)"
    monkeypatch.setenv("DEEPGAP_QUANT_ROW_QUANT", "triton")
    assert _prefill_label(ex).endswith(
        "; 8-bit inputs quantized by the row kernel (DEEPGAP_QUANT_ROW_QUANT=triton)"
    )
