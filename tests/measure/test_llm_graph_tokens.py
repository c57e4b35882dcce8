"""The graph step's greedy tokens taken in its graph (`llm_steps.feed_tail`, `_GraphStep.next_token`).

On the CPU a stand-in graph replays the static step eagerly, so the bookkeeping (what the last replay left in
the step's input and position, and when a replay must set them) is checked without a GPU; a GPU test holds
the captured graph's tokens to its logits' greedy ones.
"""

import pytest
import torch

from deepgap.measure.llm_steps import _GraphStep, feed_tail, make_step
from deepgap.measure.llm_timing import generate, greedy, prompts, token_step
from deepgap.measure.models.llama_net import build_llama


@pytest.fixture(scope="module")
def tiny():
    return build_llama("llama-tiny", seed=0)


def test_the_tail_feeds_the_token_and_the_next_position():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 0.0, 0.0, 0.0]])
    ids, pos = torch.zeros(2, 1, dtype=torch.int64), torch.tensor([7])
    tok = feed_tail(logits, ids, pos)
    assert tok.tolist() == [[1], [0]] and torch.equal(ids, tok) and pos.item() == 8


class _Replayed:
    """A stand-in CUDA graph: the static step and the tail run eagerly into the step's fixed buffers."""

    def __init__(self, step: _GraphStep) -> None:
        self.step, self.inputs = step, []

    def replay(self) -> None:
        s = self.step
        self.inputs.append((s.ids.clone(), int(s.pos.item())))
        s.logits.copy_(s.model.decode_step(s.ids, s.pos))
        s.tok.copy_(feed_tail(s.logits, s.ids, s.pos))


def _cpu_graph_step(model, batch: int) -> _GraphStep:
    step = object.__new__(_GraphStep)  # the CUDA capture skipped: its bookkeeping is what is under test
    step.model, step.cache, step.pdl, step.fed = model, model.cache, "off: stand-in", (None, None)
    step.ids = torch.zeros(batch, 1, dtype=torch.int64)
    step.pos = torch.zeros(1, dtype=torch.int64)
    step.logits = torch.zeros(batch, model.shape.vocab)
    step.tok = torch.zeros(batch, 1, dtype=torch.int64)
    step.graph = _Replayed(step)

    def capture(ids, position) -> None:  # a new cache (`generate` makes one): captured again, nothing fed
        step.cache, step.fed = model.cache, (None, None)

    step._capture = capture
    return step


def test_tokens_taken_in_the_graph_are_the_eager_generation(tiny):
    ids = prompts(tiny.shape.vocab, 2, 7, seed=3)
    tiny.setup_cache(2, 20)
    eager = generate(tiny, ids, 8)
    tiny.setup_cache(2, 20)
    make_step(tiny, "static")  # the static step's attention, as a graph step plugs it
    step = _cpu_graph_step(tiny, 2)
    assert torch.equal(generate(tiny, ids, 8, step=step), eager)
    # from the second step on the replay reads what the last one fed: nothing copied or filled before it
    assert [p for _, p in step.graph.inputs] == list(range(7, 14))


def test_a_replay_sets_what_the_last_did_not_leave(tiny):
    ids = prompts(tiny.shape.vocab, 1, 5, seed=1)
    tiny.setup_cache(1, 16)
    with torch.inference_mode():
        tok = greedy(tiny.prefill(ids))
        make_step(tiny, "static")
        step = _cpu_graph_step(tiny, 1)
        nxt = token_step(step)
        a = nxt(tok, 5)
        other = torch.full_like(a, 3)
        nxt(other, 6)  # not the token it returned: its own input is set
        assert torch.equal(step.graph.inputs[-1][0], other)
        step(a, 9)  # the logits' call: its caller feeds its tokens and may jump position
        assert step.graph.inputs[-1][1] == 9 and step.fed == (None, 10)
        b = nxt(a, 10)
        assert step.graph.inputs[-1][1] == 10 and torch.equal(step.graph.inputs[-1][0], a)
        assert b is not step.tok  # the caller's copy: the next replay does not change it


def test_token_step_of_a_step_without_a_graph_is_greedy_of_its_logits(tiny):
    ids = prompts(tiny.shape.vocab, 1, 4, seed=2)
    tiny.setup_cache(1, 8)
    with torch.inference_mode():
        tok = greedy(tiny.prefill(ids))
        static = make_step(tiny, "static")
        assert torch.equal(token_step(static)(tok, 4), greedy(tiny.decode_step(tok, 4)))


@pytest.mark.gpu
def test_the_captured_graph_gives_its_logits_greedy_tokens():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run through the device machine)")
    model = build_llama("llama-tiny", seed=0, device="cuda").to(torch.bfloat16)
    ids = prompts(model.shape.vocab, 2, 16, 0).cuda()
    with torch.inference_mode():
        model.setup_cache(2, 40)
        first = greedy(model.prefill(ids))
        by_logits = make_step(model, "cuda-graph", "default", compiled=True)
        tok, want = first, []
        for i in range(6):
            tok = greedy(by_logits(tok, 16 + i)).clone()
            want.append(tok)
        model.setup_cache(2, 40)  # a new cache: a new step and the same prompt
        model.prefill(ids)
        in_graph = make_step(model, "cuda-graph", "default", compiled=True)
        nxt, tok, got = token_step(in_graph), first, []
        for i in range(6):
            tok = nxt(tok, 16 + i)
            got.append(tok)
    assert torch.equal(torch.cat(got, 1), torch.cat(want, 1))
