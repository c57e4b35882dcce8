"""llama-tiny's decode in fp8 at batch 1: the tests' logits of one path against another.

`fp8_graph_logits`: the GPU tests' compiled CUDA-graph steps; `prefill_both`: two decoders (one path and the
other) prefilled alike, for the CPU tests' steps.
"""

from __future__ import annotations

import torch


def fp8_graph_logits(follow: torch.Tensor | None = None, steps: int = 4):
    """``(logits, model)``: ``steps`` graphed steps from position 16 after 16 seeded prompt tokens.

    The fp8 swap reads the environment's switches as it is built (`llm_fused.fuse`). Each step's input is the
    greedy token of its own logits, or of ``follow``'s (another path's logits: both steps then see the same
    inputs).
    """
    from deepgap.measure.decode_config import LINEAR_SWAPS
    from deepgap.measure.llm_steps import make_step
    from deepgap.measure.llm_timing import prompts
    from deepgap.measure.models.llama_net import build_llama

    model = LINEAR_SWAPS["fp8"](build_llama("llama-tiny", seed=0, device="cuda"))
    ids = prompts(model.shape.vocab, 1, 16, 0).cuda()
    with torch.inference_mode():
        model.setup_cache(1, 40)
        tok = model.prefill(ids).argmax(-1, keepdim=True)
        step = make_step(model, "cuda-graph", "default", compiled=True)
        out = []
        for i in range(steps):
            out.append(step(tok, 16 + i).float().clone())
            tok = (out[-1] if follow is None else follow[i]).argmax(-1, keepdim=True)
    return torch.stack(out), model


def prefill_both(first, second, prompt: int = 6, length: int = 12) -> torch.Tensor:
    """Both decoders' caches made for one sequence of ``length`` and prefilled with the same ``prompt`` seeded
    tokens (in inference mode); returns ``second``'s greedy next token, the first step's input for both."""
    from deepgap.measure.llm_timing import prompts

    ids = prompts(first.shape.vocab, 1, prompt, 0)
    with torch.inference_mode():
        for m in (first, second):
            m.setup_cache(1, length)
        tok = second.prefill(ids).argmax(-1, keepdim=True)
        first.prefill(ids)
    return tok
