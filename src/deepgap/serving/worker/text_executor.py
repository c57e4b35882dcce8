"""The real server for a text model: token-id requests of drawn lengths, each batch run at its padded shape.

The same pipeline as images (`deepgap.serving.worker.server.PipelinedExecutor`: copy-in on one stream,
the engine and copy-out on another, ``depth`` batches in flight), with token ids for inputs. Request
``k`` (in queue order, `deepgap.serving.sim.seqlen.queue_order`) lives in row ``k % size`` of one int64
ring of ``max_len`` columns (pinned on a GPU); its length is the level's ``lengths[k]``. A batch of
``count`` requests is copied in as whole rows (one or two contiguous copies), then on the compute
stream padded to ``(b, P)``: ``b`` the smallest calibrated batch size ≥ ``count`` (as for images), ``P``
the batch's longest length or its bucket (`Padding.pad_to`). The model gets a key padding mask (True
for a request's own tokens; the batch-padding rows attend to their first token only) whenever the
distribution has more than one length, so calibration and serving time the same masked attention; a
fixed length runs unmasked (nothing is ever padded). Useful and padded tokens are counted per batch.
With ``--padding packed`` the batch is not padded at all: the model gets the batch's packed layout
(`deepgap.measure.models.bert_net.Packed.of_lengths`, made on the compute stream from the lengths already on
the device and the token count known here), its batch-padding rows one token each; padded tokens are the
useful ones.

Under MLCommons LoadGen (`set_samples`, `submit_samples`) a batch is LoadGen's samples, not a range of
arrivals: sample ``s`` has the length its QSL gave it and lives in ring row ``s % size``; the batch's rows
and lengths are gathered into a staging buffer and copied in with one copy each.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from deepgap.serving.sim.seqlen import Padding
from deepgap.serving.worker.ring import spans
from deepgap.serving.worker.server import PipelinedExecutor, Ticket
from deepgap.serving.worker.streams import CudaStreams, InlineStreams


class TokenExecutor(PipelinedExecutor):
    """Runs batches of ring requests through ``run(ids, mask)``.

    The image executor's protocol and its waits (`done`, `wait`, a synchronous call, `output`, `sync`,
    `close`, `bucket`) are inherited; the ring, the padding and the engine call are a text model's.
    """

    def __init__(
        self,
        run: Any,
        device: str,
        batch_sizes: list[int],
        max_len: int,
        vocab: int,
        pad: Padding,
        masked: bool,
        pool_size: int = 256,
        seed: int = 0,
        streams: Any = None,
    ) -> None:
        self.torch, self.run, self.device, self.pad, self.masked = torch, run, device, pad, masked
        self.cuda = device.startswith("cuda")
        self.buckets = sorted(batch_sizes)
        self.size = max(pool_size, self.buckets[-1])
        g = torch.Generator().manual_seed(seed + 7)
        ids = torch.randint(1, vocab, (self.size, max_len), generator=g, dtype=torch.int64)
        self.ring = ids.pin_memory() if self.cuda else ids
        self.max_len = max_len
        self.st = streams or (CudaStreams(device) if self.cuda else InlineStreams())
        self.depth = 1 if isinstance(self.st, InlineStreams) else 2
        top = self.buckets[-1]
        # zeros, not empty: a batch's padding rows (past its requests) read a slot's rows before any request
        # was copied there, and an uninitialised id is past the vocabulary (the embedding fails)
        self.slots = [
            torch.zeros((top, max_len), dtype=torch.int64, device=device) for _ in range(self.depth)
        ]
        self.positions = torch.arange(max_len, device=device)
        self.host_out: list[dict[int, Any]] = [{} for _ in range(self.depth)]
        self.copy_stream, self.compute_stream = self.st.stream(), self.st.stream()
        self.consumed: list[Any] = [None] * self.depth
        self.k = 0
        self.last_out: Any = None
        self.fixed: int | None = None  # calibration: every request is this long
        self.set_level(np.full(1, max_len, dtype=np.int64))
        if self.cuda:
            torch.cuda.synchronize(device)

    def set_level(self, lengths: np.ndarray) -> None:
        """The lengths of the requests to come, in queue order (position ``k`` wraps past the end)."""
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.dev_lengths = torch.as_tensor(self.lengths).to(self.device)
        self.useful_tokens = self.padded_tokens = 0
        if self.cuda:  # the streams read the lengths: they start after the default stream's copy
            torch.cuda.synchronize(self.device)

    def _lengths(self, first: int, count: int) -> tuple[np.ndarray, Any]:
        """(host, device) lengths of requests ``first … first+count-1``."""
        m = len(self.lengths)
        if self.fixed is not None:
            return np.full(count, self.fixed), None
        if first % m + count <= m:
            s = first % m
            return self.lengths[s : s + count], self.dev_lengths[s : s + count]
        idx = np.arange(first, first + count) % m
        return self.lengths[idx], self.dev_lengths[torch.as_tensor(idx, device=self.device)]

    def submit(self, first: int, count: int) -> Ticket:
        """Issue requests ``first … first+count-1`` without waiting for them (`PipelinedExecutor.issue`)."""
        t0 = time.perf_counter()
        b = self.bucket(count)
        lens, dev_lens = self._lengths(first, count)
        padded = self.pad.pad_to(int(lens.max())) if self.fixed is None else self.fixed
        tokens = self._count(lens, count, padded)
        return self.issue(
            t0,
            b,
            lambda slot: self._copy_in(self.slots[slot], first, count),
            lambda slot: self._forward(self.slots[slot], count, b, padded, dev_lens, tokens + b - count),
        )

    def _count(self, lens: np.ndarray, count: int, padded: int) -> int:
        """Count a batch's useful and padded tokens; its real tokens (the packed layout's, batch padding aside)."""
        real = int(lens.sum())
        self.useful_tokens += real
        self.padded_tokens += real if self.pad.packed else count * padded
        return real

    def _copy_in(self, buf: Any, first: int, count: int) -> None:
        for r, d, n in spans(first, count, self.size):
            buf[d : d + n].copy_(self.ring[r : r + n], non_blocking=self.cuda)

    def _forward(self, buf: Any, count: int, b: int, padded: int, dev_lens: Any, tokens: int = 0) -> Any:
        """The model on the batch padded to ``(b, padded)``; batch-padding rows are one token long.

        Packed (``tokens``: the rows' tokens, batch padding included): the same rows laid end to end.
        """
        ids = buf[:b, :padded]  # rows past ``count`` hold stale ids: padding, masked to one token below
        if not self.masked and not self.pad.packed:
            return self.run(ids)
        lens = torch.ones(b, dtype=torch.int64, device=self.device)
        lens[:count] = padded if dev_lens is None else dev_lens
        if self.pad.packed:
            from deepgap.measure.models.bert_net import Packed

            return self.run(ids, packed=Packed.of_lengths(lens, tokens or b * padded, padded))
        return self.run(ids, self.positions[:padded][None, :] < lens[:, None])

    def set_samples(self, lengths: np.ndarray) -> None:
        """LoadGen's QSL: sample ``s`` is ``lengths[s]`` tokens long (its ids: ring row ``s % size``)."""
        torch, top = self.torch, self.buckets[-1]
        self.sample_lengths = np.asarray(lengths, dtype=np.int64)
        self.fixed = None
        self.useful_tokens = self.padded_tokens = 0
        self.stage = [
            torch.empty((top, self.max_len), dtype=torch.int64, pin_memory=self.cuda)
            for _ in range(self.depth)
        ]
        self.stage_len = [
            torch.empty(top, dtype=torch.int64, pin_memory=self.cuda) for _ in range(self.depth)
        ]
        self.dev_len = [torch.empty(top, dtype=torch.int64, device=self.device) for _ in range(self.depth)]
        self.copied: list[Any] = [None] * self.depth  # per slot: the copy stream's event after its last copy

    def submit_samples(self, indices: list[int]) -> Ticket:
        """Issue LoadGen's samples ``indices`` as one batch, padded as a level's batch is (`submit`)."""
        t0 = time.perf_counter()
        idx = np.asarray(indices, dtype=np.int64)
        count = len(idx)
        b = self.bucket(count)
        lens = self.sample_lengths[idx]
        padded = self.pad.pad_to(int(lens.max()))
        tokens = self._count(lens, count, padded) + b - count
        rows, lens_t = self.torch.from_numpy(idx % self.size), self.torch.from_numpy(lens)
        slot = self.k % self.depth
        prev = self.copied[slot]  # the staging buffer is rewritten only once its last copy has left it

        def copy_in(s: int) -> None:
            if prev is not None:
                self.st.synchronize(prev)
            self.torch.index_select(self.ring, 0, rows, out=self.stage[s][:count])
            self.stage_len[s][:count].copy_(lens_t)
            self.slots[s][:count].copy_(self.stage[s][:count], non_blocking=self.cuda)
            self.dev_len[s][:count].copy_(self.stage_len[s][:count], non_blocking=self.cuda)

        t = self.issue(
            t0,
            b,
            copy_in,
            lambda s: self._forward(self.slots[s], count, b, padded, self.dev_len[s][:count], tokens),
        )
        self.copied[slot] = t.events[1]
        return t

    def engine_interval_s(self, b: int, iterations: int) -> float:
        """Seconds per batch of the model alone at the calibrated length, inputs on the device."""
        padded = self.fixed or self.max_len
        st, ks = self.st, self.compute_stream
        e0 = st.record(ks)
        for _ in range(iterations):
            st.enqueue(ks, lambda: self._forward(self.slots[0], b, b, padded, None))
        e1 = st.record(ks)
        st.synchronize(e1)
        return st.elapsed_s(e0, e1) / iterations
