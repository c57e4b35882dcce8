"""A served decoder's packed admissions compiled (`llm_engines.packed_prefill`; ``DEEPGAP_DECODE_PREFILL=eager``: not).

The token count is dynamic, so admissions of different buckets share the compiled code (one compile in all, no
restart of Dynamo's analysis); the tokens are each request's alone, as eager. On the
CPU (Inductor's C++ code, about 20 s); the GPU test replays the compiled buckets as CUDA graphs.
"""

import numpy as np
import pytest
import torch

from deepgap.measure.llm_timing import generate
from deepgap.measure.models.llama_net import build_llama
from deepgap.serving.worker.llm_engines import packed_prefill
from deepgap.serving.worker.llm_setup import Ticking, _prefill_label


def _serve(ex, ins, outs, arrivals):
    from deepgap.serving.sim.clock import VirtualClock
    from deepgap.serving.sim.continuous import serve_continuous

    ex.set_level(3, ins, record=True)
    clock = VirtualClock()
    with torch.inference_mode():
        serve_continuous(arrivals, ins, outs, 3, clock, Ticking(ex, clock))
    return [ex.record[r] for r in range(len(ins))]


def test_compiled_where_the_engine_compiles_unless_the_switch_says_eager(monkeypatch):
    tiny = build_llama("llama-tiny", seed=0)
    assert packed_prefill(tiny, None) == (tiny.prefill_packed, "")  # an engine without a compile mode
    for how in ("auto", "compiled"):
        monkeypatch.setenv("DEEPGAP_DECODE_PREFILL", how)
        fn, label = packed_prefill(tiny, "default")
        assert fn != tiny.prefill_packed and label == "compiled (default, token rows dynamic)"
    monkeypatch.setenv("DEEPGAP_DECODE_PREFILL", "eager")
    assert packed_prefill(tiny, "default") == (tiny.prefill_packed, "")


def test_compiled_packed_admissions_give_each_request_its_tokens(monkeypatch):
    from torch._dynamo.utils import counters

    from deepgap.serving.worker.llm_executor import SlotExecutor

    monkeypatch.delenv("DEEPGAP_DECODE_PREFILL", raising=False)  # the default
    tiny = build_llama("llama-tiny", seed=0)
    ex = SlotExecutor(tiny, "cpu", 3, 24, 12, seed=3, compile_mode="default", prefill="packed")
    ex.steps.decode = tiny.decode_slots  # the step eager here: this test compiles the admissions only
    ex.prefills.tokens = (16, 24, 32)
    assert "compiled (default, token rows dynamic" in _prefill_label(ex)
    ins, outs = np.array([12, 4, 9, 7, 5]), np.array([5, 8, 2, 6, 3])
    before, traced = counters["stats"]["unique_graphs"], counters["aot_autograd"]["total"]
    got = _serve(ex, ins, outs, np.array([0.0, 0.0, 0.0, 1.5e-3, 2e-3]))
    assert sorted(ex.prefills.inputs) == [16, 32]  # two buckets: 25 rows as 32, a lone 7 or 5 as 16
    assert counters["stats"]["unique_graphs"] - before == 1
    assert counters["aot_autograd"]["total"] - traced == 1  # a restarted analysis traces it twice
    want = [generate(tiny, ex.prompt(r, int(ins[r]))[None, :], int(outs[r]))[0].tolist() for r in range(5)]
    assert got == want


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run through the device machine)")
def test_compiled_packed_buckets_replayed_as_graphs_give_the_eager_tokens(monkeypatch):
    from deepgap.serving.worker.llm_executor import SlotExecutor

    ins, outs = np.array([30, 7, 19, 25, 3]), np.array([9, 16, 5, 12, 20])
    tokens = []
    for compiled in (False, True):
        monkeypatch.setenv("DEEPGAP_DECODE_PREFILL", "auto" if compiled else "eager")
        model = build_llama("llama-tiny", seed=0, device="cuda")  # fp32: no rounding to tell the two apart
        ex = SlotExecutor(
            model, "cuda", 4, 64, 32, seed=3, graph=True, compile_mode="default", prefill="packed"
        )
        assert bool(ex.packed_how) == compiled
        tokens.append(_serve(ex, ins, outs, np.arange(5) * 2e-3))
    assert tokens[0] == tokens[1]
