"""Mixed-length text batches on a CUDA GPU (issue 50; skipped without CUDA): the varlen attention against the
padded one, and every engine that takes the input (eager, CUDA graphs, compile-freeze, quant) against each
sequence run alone.

Run on the device with ``bash benchmarks/text_lengths.sh gputests``.
"""

from __future__ import annotations

import pytest
import torch
from tinybert_gpu import sweep_tinybert

from deepgap.core.records import Status
from deepgap.measure.models import text_batch
from deepgap.measure.models.bert_net import Packed

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_varlen_attention_equals_the_padded_one(dtype):
    batch = text_batch.TextBatch("packed", (1, 384, 77, 200, 3, 129))
    p = Packed.of_batch(batch).to("cuda")
    assert Packed.kind("cuda", dtype) == Packed.VARLEN
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch.tokens, 16, 64, device="cuda", generator=g, dtype=dtype) for _ in range(3))
    fast = p.attend(q, k, v)
    assert p.ran == Packed.VARLEN
    slow = p.attend(q.float(), k.float(), v.float())  # fp32: the padded SDPA fallback, on the same tensors
    assert p.ran == Packed.PADDED
    torch.testing.assert_close(fast.float(), slow, rtol=2e-2, atol=2e-2)


def test_bert_base_packed_in_half_precision_agrees_with_each_sequence_alone():
    from deepgap.measure.models.build import build_model

    model = build_model("bert-base", 384).eval()
    batch = text_batch.make("packed:uniform:16:384", 8, 8)
    ids = batch.ids(torch.randint(1, 30000, (8, 384), generator=torch.Generator().manual_seed(1)))
    with torch.inference_mode():
        alone = torch.cat([model(ids[i : i + 1, :n]) for i, n in enumerate(batch.lengths)])
        model = model.to("cuda", torch.float16)
        model.set_text_batch(batch)
        out = model(ids.cuda()).float().cpu()
    assert model.packed.ran == Packed.VARLEN
    rel = float((out - alone).norm() / alone.norm())
    assert rel < 0.01, rel


def test_every_engine_that_takes_it_runs_it():
    results = sweep_tinybert(
        ("eager", "cudagraph", "compile-freeze", "quant"),
        ("fp16", "fp8"),
        8,
        inputs=("packed", "padded"),
        seq_len_dist="uniform:4:64",
    )
    got = {(r.spec.engine, r.spec.input_mode.split(":")[0]) for r in results if r.status == Status.OK}
    assert got == {
        (e, m) for e in ("eager", "cudagraph", "compile-freeze", "quant") for m in ("packed", "padded")
    }
    for r in results:
        assert r.status == Status.OK, (r.spec.label(), r.reason)
        assert r.details.correctness.flagged is False, (r.spec.label(), r.details.correctness)
        tb = r.details.text_batch
        assert tb.tokens_per_sample == pytest.approx(
            text_batch.make(r.spec.input_mode, 8, 8).tokens_per_sample
        )
        if r.spec.input_mode.startswith("packed"):
            assert tb.attention == Packed.VARLEN, (r.spec.label(), tb.attention)
