"""A decoder's seeded random weights, drawn in parallel chunks, the same whatever the number of threads.

Why not torch's own initialisation: ``nn.Linear`` draws every weight at construction (Kaiming uniform) and the
decoder then draws them again from N(0, 1/fan_in) (`init_weights` says why). On the CPU torch's generator is
serial, so the 8B shape's eight billion fp32 weights were drawn twice on one core: serve's thermal warm-up,
which builds the decoder on the host as every forward configuration does, kept an H100 idle for about two
minutes before its first step (session 52). Here the decoder is built on the meta device (nothing drawn),
given storage, and drawn once: each weight in chunks of rows, each chunk from its own generator seeded by
(seed, weight, chunk), the chunks spread over threads. The draw does not depend on the thread count, and a
CUDA build draws the same way on the device's generator (other numbers than the CPU's, as before).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

CHUNK = 1 << 24  # weights per draw (64 MB in fp32): enough chunks to spread the 8B shape over 16 threads
_MIX = 1_000_003  # a prime that keeps (seed, weight, chunk) seeds apart


def init_weights(model: torch.nn.Module, seed: int, threads: int | None = None) -> None:
    """Draw ``model``'s weights: Linear N(0, 1/fan_in), the embedding N(0, 1), norms 1; a tied head once.

    Why N(0, 1/fan_in) and an N(0, 1) embedding, not HF's N(0, 0.02) everywhere: every layer's output stays
    O(1); HF's makes attention near-uniform and the logits nearly flat, so a random model's greedy tokens
    collapse to one and fp16 agreement tests nothing. ``threads``: the CPU's draws at once (default: torch's
    thread count); a GPU draws on its own.
    """
    embedding = model.embed_tokens.weight
    jobs = []
    for i, p in enumerate(model.parameters()):  # each parameter once: a tied head is the embedding
        if p.dim() == 1:  # the RMSNorms' scales
            p.data.fill_(1.0)
            continue
        std = 1.0 if p is embedding else p.shape[1] ** -0.5
        rows = max(1, CHUNK // p.shape[1])
        for j, start in enumerate(range(0, p.shape[0], rows)):
            jobs.append((p.data[start : start + rows], std, ((seed * _MIX + i) * _MIX + j) % (1 << 63)))

    def draw(job) -> None:
        t, std, s = job
        t.normal_(0.0, std, generator=torch.Generator(device=t.device).manual_seed(s))

    if embedding.device.type != "cpu":
        for job in jobs:
            draw(job)
        return
    with ThreadPoolExecutor(max_workers=max(1, threads or torch.get_num_threads())) as pool:
        list(pool.map(draw, jobs))
