"""A served decoder's admissions: the newcomers' prefill, packed or padded to a bucket, replayed as a CUDA graph.

Runs in the worker process only. Why graphs: under Poisson arrivals most admissions bring one to a few short
prompts, and an eager prefill of an 8B decoder pays for about a thousand kernel launches from Python
whatever its size: 52–69 ms for one 64-token prompt on an H200 (session 19), against about 2 ms of weight
reads. Every running slot waits through it, so its TPOT grows by that much per admission.

Two modes (the executor's ``prefill``; the worker's ``DEEPGAP_SERVE_PREFILL``, packed by default):

- **Packed** (`PackedPrefill`, vLLM's layout): the prompts concatenated into one sequence of ``T`` token
  rows (`Llama.prefill_packed`), ``T`` the total rounded up to a bucket of rows
  (`deepgap.serving.sim.packing`, which the simulator shares), at most ``PACKED_TOKENS``; an admission of
  more tokens or more than ``prompts`` newcomers runs as several packed prefills. Why: the 8B prefill is
  compute-bound (about 30 µs per token row), so a padded row costs what a real one does, and a padded
  bucket (6 prompts × 256 positions: 1,536 rows) held about 800 real ones (session 20). Only ``T``
  changes a graph's shape: the head runs over a fixed gather of ``prompts`` last rows. Padding rows write
  K and V into the sink row at position 0 and attend to each other only. On a CPU it runs eagerly,
  padded to its bucket all the same (what the simulator charges).
- **Padded** (`BucketedPrefill`): a bucket is (newcomers, prompt length): the count rounded up to a power
  of two or the count half-way to the next (`count_buckets`) up to ``GRAPH_PROMPTS``, the longest prompt
  rounded up to a multiple of ``LENGTH_QUANTUM`` (capped by the cache and the prompt ring). Padding rows
  (the count rounded up) write into the sink row with ring row 0 of length 1; padding positions (a prompt
  shorter than the bucket) hold the ring's next ids: causal attention keeps a row's real tokens from seeing
  them, and the keys they write sit past the row's position, masked by the decode step until the row's own
  tokens overwrite them (as in `Llama.prefill_slots`' right padding). Larger admissions (more than
  ``GRAPH_PROMPTS`` newcomers) and any device without graphs run the eager prefill, unpadded; ``padded``
  without ``graph`` runs the padded prefill eagerly: the CPU tests check that padding changes no token.

Each bucket's prefill is captured once, before serving, with the largest buckets first so that the shared
memory pool is sized by them. A replay reads device vectors that one host copy fills. The **sink row** is
one cache row past every level's slots (the executor allocates ``max_slots + 1`` rows), which no decode
step reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from deepgap.serving.sim.packing import PACKED_TOKENS, groups, padded_length, smallest_bucket, token_buckets

Each = Callable[[int, int, Any], None]  # told (index, count, key) as each bucket is captured
GRAPH_PROMPTS = 64  # the most newcomers one captured prefill takes
LENGTH_QUANTUM = 64  # prompt lengths are padded up to a multiple of this


def count_buckets(max_count: int) -> tuple[int, ...]:
    """The newcomer counts with a bucket, up to ``min(max_count, GRAPH_PROMPTS)`` rounded up to one of them.

    Powers of two and the counts half-way (1, 2, 3, 4, 6, 8, 12, …): a bucket pads at most a third of its
    rows. With powers of two alone an admission of 5 ran as 8; at 8B an admission of a few prompts costs
    about 6 ms per 192-token prompt, compute-bound, so padding rows cost as much as real ones (session 20:
    the served step took 11 ms and the prefill after it most of a 53-ms TPOT).
    """
    top = min(max(1, max_count), GRAPH_PROMPTS)
    counts = sorted({c for i in range(math.ceil(math.log2(top)) + 1) for c in (1 << i, 3 << i >> 1)} - {0})
    return tuple(c for c in counts if c < top) + (next(c for c in counts if c >= top),)


class _Replayed:
    """Buckets that each run one body over device inputs filled by one host copy, captured and replayed.

    Eager without ``graph``; else each bucket is captured on first use (or by ``prepare``, before serving)
    and replayed after.

    A subclass gives ``_host(key, rows, lens, slots)``, the bucket's inputs as a CPU tensor with padding
    aimed at the sink (with no prompts, all of it: what a capture's warm-up runs on, changing no slot), and
    ``_body(key)``, the prefill over ``self.inputs[key]``.
    """

    def __init__(self, ex: Any, graph: bool) -> None:
        self.ex, self.graph = ex, graph
        self.graphs: dict[Any, Any] = {}
        self.inputs: dict[Any, torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle() if graph else None

    def _launch(self, key: Any, rows: list[int], lens: list[int], slots: list[int]) -> None:
        host = self._host(key, rows, lens, slots)
        buf = self._inputs(key, host)
        buf.copy_(host)
        g = self.graphs.get(key)
        if g is None and self.graph:
            g = self.graphs[key] = self._capture(key)
            buf.copy_(host)  # the capture's warm-up ran on the sink's inputs
        if g is None:
            self._body(key)
        else:
            g.replay()

    def _prepare(self, keys: list[Any], each: Each | None = None) -> None:
        """Capture ``keys`` in order (the largest first: it sizes the shared pool); ``each(i, n, key)`` after each."""
        for i, key in enumerate(keys if self.graph else ()):
            if key not in self.graphs:
                self.graphs[key] = self._capture(key)
            if each is not None:
                each(i, len(keys), key)

    def _inputs(self, key: Any, host: torch.Tensor) -> torch.Tensor:
        buf = self.inputs.get(key)
        if buf is None:
            buf = self.inputs[key] = torch.empty_like(host, device=self.ex.device)
        return buf

    def _capture(self, key: Any) -> Any:
        """Warm up on a side stream and capture, every row aimed at the sink (no slot's state changes)."""
        host = self._host(key, [], [], [])
        self._inputs(key, host).copy_(host)
        return capture_graph(lambda: self._body(key), self.ex.device, self.pool, warmups=2)

    def _host(self, key: Any, rows: list[int], lens: list[int], slots: list[int]) -> torch.Tensor:
        raise NotImplementedError

    def _body(self, key: Any) -> None:
        raise NotImplementedError


class BucketedPrefill(_Replayed):
    """Prefill of ``count`` newcomers through a padded bucket: replayed as a graph, or eager (module docstring).

    A bucket's inputs (``inputs[(k, p)]``, ``(3, k)``): the prompts' ring rows, their cache rows, their lengths.
    """

    def __init__(self, ex: Any, max_len: int, graph: bool) -> None:
        super().__init__(ex, graph)
        self.max_len = max_len
        self.counts = count_buckets(ex.slots)

    def lengths(self, longest: int) -> tuple[int, ...]:
        """The padded lengths up to ``longest``'s bucket."""
        top = self.length_bucket(longest)
        return tuple(sorted({self.length_bucket(v) for v in range(1, top + 1, LENGTH_QUANTUM)} | {top}))

    def length_bucket(self, longest: int) -> int:
        """``longest`` rounded up to the quantum, within the cache and the ring."""
        return padded_length(longest, LENGTH_QUANTUM, self.max_len)

    def bucket(self, count: int, longest: int) -> tuple[int, int] | None:
        """The bucket of an admission, or None where it is too large for one (eager, unpadded)."""
        if count > self.counts[-1]:
            return None
        return smallest_bucket(count, self.counts), self.length_bucket(longest)

    def __call__(self, rows: list[int], lens: list[int], slots: list[int]) -> bool:
        """Prefill ring ``rows`` of ``lens`` into cache ``slots``; False where no bucket takes it."""
        key = self.bucket(len(rows), max(lens))
        if key is None:
            return False
        self._launch(key, rows, lens, slots)
        return True

    def prepare(self, longest: int, each: Each | None = None) -> None:
        """Capture every bucket up to ``longest`` tokens, the largest first (they size the shared pool)."""
        lengths, counts = sorted(self.lengths(longest), reverse=True), sorted(self.counts, reverse=True)
        self._prepare([(k, p) for p in lengths for k in counts], each)

    def _host(self, key: tuple[int, int], rows: list[int], lens: list[int], slots: list[int]) -> torch.Tensor:
        """Padding rows: ring row 0, length 1, into the sink."""
        pad = key[0] - len(rows)
        return torch.tensor(
            [rows + [0] * pad, slots + [self.ex.sink] * pad, lens + [1] * pad], dtype=torch.int64
        )

    def _body(self, key: tuple[int, int]) -> None:
        """The padded prefill itself: the next token and position of every row (the sink's included)."""
        ex, buf = self.ex, self.inputs[key]
        rows, where, lens = buf[0], buf[1], buf[2]
        logits = ex.model.prefill_slots(ex.ring[rows, : key[1]], where, lens)
        ex.tok[where, 0] = logits.argmax(-1)
        ex.pos[where] = lens


def capture_graph(body: Any, device: str, pool: Any, warmups: int) -> Any:
    """``body`` run ``warmups`` times on a side stream (lazy inits, autotuning), then captured into ``pool``."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmups):
            body()
    torch.cuda.current_stream(device).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        body()
    return g


class PackedPrefill(_Replayed):
    """Prefill newcomers packed into buckets of ``T`` token rows: replayed as graphs, or eager (module docstring).

    ``prompts``: the logits one prefill gathers (``GRAPH_PROMPTS``, or fewer where the cache has fewer
    slots); ``tokens``: the buckets of ``T`` (`deepgap.serving.sim.packing`), the largest at least the
    longest prompt. A bucket's inputs are one device vector that one host copy fills, in six parts: per
    token row its id's index in the flattened ring, its position, its cache row; per gathered prompt its
    last row, its cache row and its length. Padding rows and unused gathers aim at the sink.
    """

    def __init__(self, ex: Any, graph: bool, max_input: int) -> None:
        super().__init__(ex, graph)
        self.prompts = min(GRAPH_PROMPTS, ex.slots)
        self.tokens = token_buckets(max(max_input, min(PACKED_TOKENS, self.prompts * max_input)))

    def __call__(self, rows: list[int], lens: list[int], slots: list[int]) -> bool:
        """Prefill ring ``rows`` of ``lens`` into cache ``slots``, as one packed prefill per group."""
        for a, b in groups(lens, self.tokens[-1], self.prompts):
            self.run(smallest_bucket(sum(lens[a:b]), self.tokens), rows[a:b], lens[a:b], slots[a:b])
        return True

    def run(self, t: int, rows: list[int], lens: list[int], slots: list[int]) -> None:
        """One packed prefill of bucket ``t`` (the prompts' total at most ``t``, their count ``prompts``)."""
        self._launch(t, rows, lens, slots)

    def prepare(self, each: Each | None = None) -> None:
        """Capture every bucket, the largest first (it sizes the shared pool)."""
        self._prepare(sorted(self.tokens, reverse=True), each)

    def _host(self, t: int, rows: list[int], lens: list[int], slots: list[int]) -> torch.Tensor:
        """The bucket's inputs on the host: padding rows and unused gathers at the sink (class docstring)."""
        k, g, n, sink = len(lens), self.prompts, sum(lens), self.ex.sink
        assert n <= t and k <= g, (n, t, k, g)
        a = np.zeros(3 * t + 3 * g, dtype=np.int64)
        ln = np.asarray(lens, dtype=np.int64)
        starts = np.cumsum(ln) - ln
        pos = np.arange(n) - np.repeat(starts, ln)
        a[:n] = np.repeat(np.asarray(rows, dtype=np.int64), ln) * self.ex.ring.shape[1] + pos
        a[t : t + n] = pos
        a[2 * t : 3 * t] = sink
        a[2 * t : 2 * t + n] = np.repeat(np.asarray(slots, dtype=np.int64), ln)
        a[3 * t + g : 3 * t + 2 * g] = sink
        a[3 * t + g : 3 * t + g + k] = slots
        a[3 * t : 3 * t + k] = starts + ln - 1
        a[3 * t + 2 * g :] = 1
        a[3 * t + 2 * g : 3 * t + 2 * g + k] = ln
        return torch.from_numpy(a)

    def _body(self, t: int) -> None:
        """The packed prefill itself: the next token and position of every gathered prompt (sink's included)."""
        ex, buf, g = self.ex, self.inputs[t], self.prompts
        ids = ex.ring.view(-1)[buf[:t]]
        last, dest, lens = buf[3 * t : 3 * t + g], buf[3 * t + g : 3 * t + 2 * g], buf[3 * t + 2 * g :]
        # `Llama.prefill_packed`, eager or compiled (`llm_engines.packed_prefill`)
        logits = ex.packed(ids, buf[t : 2 * t], buf[2 * t : 3 * t], last)
        ex.tok[dest, 0] = logits.argmax(-1)
        ex.pos[dest] = lens
