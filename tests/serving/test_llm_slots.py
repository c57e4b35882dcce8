"""Continuous batching's model path (issue 51 item 4): per-slot positions in the static KV cache.

`Llama.prefill_slots` puts right-padded prompts into chosen cache rows, `Llama.decode_slots` steps every row at
its own position. Sequences admitted at different steps, with different prompt and output lengths, sharing the
cache with rows that hold nothing, must give each sequence the greedy tokens it gets alone (the eager path,
itself checked against transformers in tests/measure/models/test_llm_model.py). The tiny shape on the CPU: milliseconds.
"""

import numpy as np
import pytest
import torch

from deepgap.measure.llm_timing import generate
from deepgap.measure.models.llama_net import build_llama
from deepgap.serving.worker.llm_setup import Ticking  # the set-up check's executor on a 1-ms clock


@pytest.fixture(scope="module")
def tiny():
    return build_llama("llama-tiny", seed=0)


def _prompts(lens, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (1, n), generator=g) for n in lens]


def test_slots_admitted_mid_decode_give_each_sequence_its_tokens_alone(tiny):
    lens, outs = [5, 9, 3, 12], [6, 4, 7, 3]
    prompts = _prompts(lens)
    alone = [generate(tiny, p, o)[0].tolist() for p, o in zip(prompts, outs, strict=True)]
    slots = 4
    tiny.setup_cache(slots, 20)
    tok = torch.zeros(slots, 1, dtype=torch.int64)
    pos = torch.zeros(slots, dtype=torch.int64)
    got: dict[int, list[int]] = {}
    where: dict[int, int] = {}  # request → slot

    def admit(reqs, rows):
        p = max(lens[r] for r in reqs)
        ids = torch.zeros(len(reqs), p, dtype=torch.int64)  # right padding: zeros past each prompt
        for i, r in enumerate(reqs):
            ids[i, : lens[r]] = prompts[r][0]
        n = torch.tensor([lens[r] for r in reqs])
        first = tiny.prefill_slots(ids, torch.tensor(rows), n).argmax(-1)
        for i, (r, s) in enumerate(zip(reqs, rows, strict=True)):
            tok[s, 0], pos[s], got[r], where[r] = first[i], lens[r], [int(first[i])], s

    with torch.inference_mode():
        admit([0, 1], [2, 0])  # two prompts of different lengths, prefilled together into rows 2 and 0
        for step in range(10):
            if step == 2:
                admit([2], [3])  # a newcomer joins while the others decode; row 1 stays empty
            if step == 4:  # request 1 (4 tokens) is done: its row 0 takes request 3
                admit([3], [where[1]])
            nxt = tiny.decode_slots(tok, pos).argmax(-1)
            for r, s in where.items():
                if len(got[r]) < outs[r] and (r != 1 or step < 4):
                    got[r].append(int(nxt[s]))
                    tok[s, 0] = nxt[s]
                    pos[s] += 1
    assert [got[r] for r in range(4)] == alone


def test_static_slot_step_matches_the_shared_position_step_for_one_batch(tiny):
    """With every row at the same position, the per-row step is the existing static step, exactly."""
    ids = _prompts([6])[0].repeat(3, 1)
    tiny.setup_cache(3, 12)
    with torch.inference_mode():
        tok = tiny.prefill(ids).argmax(-1, keepdim=True)
        shared = tiny.decode_step(tok, torch.tensor([6]))
    tiny.setup_cache(3, 12)
    with torch.inference_mode():
        tok2 = tiny.prefill_slots(ids, torch.arange(3), torch.tensor([6, 6, 6])).argmax(-1, keepdim=True)
        rows = tiny.decode_slots(tok2, torch.full((3,), 6))
    assert torch.equal(tok, tok2)
    torch.testing.assert_close(rows, shared, rtol=1e-5, atol=1e-5)


def test_admission_buckets_pad_at_most_a_third_of_their_rows():
    from deepgap.serving.worker.llm_prefill import GRAPH_PROMPTS, count_buckets

    assert count_buckets(64) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    assert count_buckets(5) == (1, 2, 3, 4, 6) and count_buckets(1) == (1,)
    assert count_buckets(512)[-1] == GRAPH_PROMPTS  # more newcomers than that: the eager prefill
    for n in range(1, GRAPH_PROMPTS + 1):
        k = next(c for c in count_buckets(GRAPH_PROMPTS) if c >= n)
        assert k - n <= k / 3


# per mode: the executor's prefill, the buckets set on it, and the buckets the admissions must go through
PREFILLS = {
    "unpadded": ("unpadded", None, None),
    "bucketed": ("padded", (4,), [(4, 24)]),  # every count padded to 4, prompts to the cache's 24 positions
    "bucketed-one": ("padded", (1,), [(1, 24)]),  # three newcomers at once: the unpadded prefill beside
    "packed": ("packed", (16, 24, 32), [16, 32]),  # 12+4+9 = 25 tokens as 32 rows, a lone 7 or 5 as 16
    "packed-split": ("packed", (8, 12, 16), [8, 12, 16]),  # 12+4 = 16 rows, then 9 as 12, 7 and 5 as 8
}


@pytest.mark.parametrize("prefill", list(PREFILLS))
def test_slot_executor_serves_the_loop_and_records_each_requests_tokens(tiny, prefill):
    """The worker's executor through the server's own loop on a virtual clock, tokens against each alone.

    Three prompts of different lengths arrive together, two more while they decode. ``bucketed``: admissions
    padded to a bucket of newcomers (padding rows go to the sink row), eager here, as a GPU replays them;
    ``packed``: the prompts concatenated into one sequence of token rows, padded to a bucket of rows (here
    too: 25 tokens in 32 rows); ``packed-split``: an admission over the largest bucket (16 rows) runs as
    several packed prefills.
    """
    from deepgap.serving.sim.clock import VirtualClock
    from deepgap.serving.sim.continuous import serve_continuous
    from deepgap.serving.worker.llm_executor import SlotExecutor

    mode, buckets, went = PREFILLS[prefill]
    ex = SlotExecutor(tiny, "cpu", 3, 24, 12, seed=3, prefill=mode)
    if mode == "padded":
        ex.prefills.counts = buckets
    elif mode == "packed":
        ex.prefills.tokens = buckets
    ins, outs = np.array([12, 4, 9, 7, 5]), np.array([5, 8, 2, 6, 3])
    ex.set_level(3, ins, record=True)
    clock = VirtualClock()
    with torch.inference_mode():
        log = serve_continuous(
            np.array([0.0, 0.0, 0.0, 1.5e-3, 2e-3]), ins, outs, 3, clock, Ticking(ex, clock)
        )
    assert log.n == 5 and log.output_len.tolist() == outs.tolist()
    if went is not None:  # the buckets it went through: (newcomers, padded length), or packed rows
        assert sorted(ex.prefills.inputs) == went
    want = [generate(tiny, ex.prompt(r, int(ins[r]))[None, :], int(outs[r]))[0].tolist() for r in range(5)]
    assert [ex.record[r] for r in range(5)] == want


def test_a_retired_slots_row_goes_back_to_position_0_and_the_others_keep_their_tokens(tiny):
    """After every step, each free row sits at position 0 (the attention reads a row up to its position; a
    stale one re-read its last sequence's context every step), while every request's tokens stay its own:
    slots retire and are admitted again mid-run. Calibration's steps (no row running) keep their positions."""
    from deepgap.serving.sim.clock import VirtualClock
    from deepgap.serving.sim.continuous import serve_continuous
    from deepgap.serving.worker.llm_executor import SlotExecutor

    ex = SlotExecutor(tiny, "cpu", 3, 24, 12, seed=3, prefill="packed")
    ins, outs = np.array([12, 4, 9, 7, 5, 6]), np.array([2, 8, 1, 6, 3, 2])  # the third: its prefill's token
    ex.set_level(3, ins, record=True)
    seen = []

    class Watching(Ticking):
        def decode(self, active):
            super().decode(active)
            seen.append((active.copy(), ex.pos[:3].tolist()))

    clock = VirtualClock()
    with torch.inference_mode():
        serve_continuous(np.array([0, 0, 0, 1.5, 2, 4]) * 1e-3, ins, outs, 3, clock, Watching(ex, clock))
    assert any(not a.all() for a, _ in seen[1:]) and any(a.all() for a, _ in seen)  # rows freed, refilled
    for active, pos in seen:
        assert all(p == 0 for p, run in zip(pos, active, strict=True) if not run), (active, pos)
    record = dict(ex.record)
    ex.set_level(3, ins)
    ex.pos[:3] = 7
    with torch.inference_mode():
        ex.decode(np.zeros(3, dtype=bool))
    assert ex.pos[:3].tolist() == [7, 7, 7]
    # last: `generate` sets the model's cache up for one sequence
    want = [generate(tiny, ex.prompt(r, int(ins[r]))[None, :], int(outs[r]))[0].tolist() for r in range(6)]
    assert [record[r] for r in range(6)] == want


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run through the device machine)")
@pytest.mark.parametrize("prefill", ["packed", "padded"])
def test_cuda_graph_slot_step_gives_the_eager_tokens(prefill):
    """The decode step captured once per slot count and replayed: the eager executor's tokens, request by request.

    Admissions in both modes (``DEEPGAP_SERVE_PREFILL``): their buckets replayed as graphs against the same
    buckets run eagerly.
    """
    from deepgap.serving.sim.clock import VirtualClock
    from deepgap.serving.sim.continuous import serve_continuous
    from deepgap.serving.worker.llm_executor import SlotExecutor

    ins, outs = np.array([30, 7, 19, 25, 3]), np.array([9, 16, 5, 12, 20])
    tokens = []
    for graph in (False, True):
        model = build_llama("llama-tiny", seed=0, device="cuda")
        ex = SlotExecutor(model, "cuda", 4, 64, 32, seed=3, graph=graph, prefill=prefill)
        ex.set_level(3, ins, record=True)
        clock = VirtualClock()
        with torch.inference_mode():
            serve_continuous(np.arange(5) * 2e-3, ins, outs, 3, clock, Ticking(ex, clock))
        tokens.append([ex.record[r] for r in range(5)])
    assert tokens[0] == tokens[1]
