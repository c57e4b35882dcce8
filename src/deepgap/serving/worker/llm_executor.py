"""The real server of a decoder: continuous batching over the static KV cache, one slot per sequence.

Runs in the worker process only. The cache holds ``max_slots`` rows of ``cache_len`` positions
(`Llama.setup_cache`); a level serves with ``slots`` of them (a policy: the first ``slots`` rows). Request
``r``'s prompt is the first ``input_len[r]`` ids of row ``r % pool`` of a seeded device-resident ring.

- ``prefill(first, count, slots)``: the newcomers' prompts go into their slots' rows; each slot's next token
  and position are set. ``prefill`` says how (`deepgap.serving.worker.llm_prefill`): ``packed`` (the
  prompts concatenated into a bucket of token rows, `Llama.prefill_packed`), ``padded`` (right-padded to
  the longest and the count, to a bucket, `Llama.prefill_slots`), both replayed as CUDA graphs with
  ``graph``, or ``unpadded`` (one eager `Llama.prefill_slots`). Default: `packing.prefill_mode`
  (``DEEPGAP_SERVE_PREFILL``; packed unless it says padded), where ``padded`` without a graph
  runs unpadded. A packed or padded cache has one more row, the padding's sink.
- ``decode(active)``: one static step over the ``slots`` rows (`Llama.decode_slots`, a position per row):
  every row's next token is its argmax and the running rows' positions advance by one (``active``, a
  device copy of the loop's mask). A row whose sequence retired since the last step is put back to position 0
  first: the step's attention reads each row up to its position, and a free row's stale position would read
  its last sequence's whole context every step (at 512 slots of the 8B load, about 70 free rows at ~290
  positions, a sixth of the step's KV reads; session 49, not yet timed on a GPU). The step, its argmax and
  the position update are one function, so on a GPU (``cudagraph``) it is captured once per slot count and
  replayed (`SlotSteps`); with a compile mode (``compile-reduce-overhead``, ``quant``:
  `deepgap.serving.worker.llm_engines`) ``decode_slots`` is compiled first (static shapes: one compile per
  slot count), as the sweep's step is.

Each call returns once the device is done (synchronised), so the loop's clock reads when the tokens
exist. ``record``: keep every request's tokens (the set-up's check against each request alone).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from deepgap.core.errors import UsageError
from deepgap.serving.sim.llm_service import HeldRows
from deepgap.serving.sim.packing import PREFILL_MODES, padded_length, prefill_mode
from deepgap.serving.worker.llm_engines import packed_prefill
from deepgap.serving.worker.llm_prefill import LENGTH_QUANTUM, BucketedPrefill, PackedPrefill, capture_graph


class SlotSteps:
    """The decode step over the first ``s`` slots: eager, or captured as a CUDA graph per slot count."""

    def __init__(self, ex: SlotExecutor, graph: bool, compile_mode: str | None = None) -> None:
        self.ex, self.graph, self.graphs = ex, graph, {}
        self.pool = torch.cuda.graph_pool_handle() if graph else None
        fn = ex.model.decode_slots
        self.decode = torch.compile(fn, mode=compile_mode, dynamic=False) if compile_mode else fn

    def _step(self, s: int) -> None:
        ex = self.ex
        logits = self.decode(ex.tok[:s], ex.pos[:s])
        ex.tok[:s, 0] = logits.argmax(-1)
        ex.pos[:s] += ex.act[:s]

    def __call__(self, s: int) -> None:
        """One step over ``s`` slots (a graph's replay once captured for ``s``)."""
        if not self.graph:
            self._step(s)
            return
        g = self.graphs.get(s)
        if g is None:
            g = self.graphs[s] = self._capture(s)
        g.replay()

    def prepare(self, s: int) -> None:
        """Capture the step over ``s`` slots now (the set-up does, for every slot count, before serving)."""
        if self.graph and s not in self.graphs:
            self.graphs[s] = self._capture(s)

    def _capture(self, s: int) -> Any:
        """Warm up on a side stream, capture the step, then put back the tokens and positions as they were.

        Why put them back: the warm-up steps run for real (capture only records), so they overwrite every
        row's token and, for running rows, advance positions; restored, the first replay is the step the
        caller asked for (it rewrites the K and V at each row's position, which the warm-up also wrote).
        """
        ex = self.ex
        saved = (ex.tok.clone(), ex.pos.clone(), ex.act.clone())
        g = capture_graph(lambda: self._step(s), ex.device, self.pool, warmups=3)
        for buf, old in zip((ex.tok, ex.pos, ex.act), saved, strict=True):
            buf.copy_(old)
        return g


class SlotExecutor:
    """Prefill newcomers into free slots and step every slot (module docstring); the loop's executor."""

    def __init__(
        self,
        model: Any,
        device: str,
        max_slots: int,
        cache_len: int,
        max_input: int,
        seed: int = 0,
        graph: bool = False,
        pool: int = 256,
        compile_mode: str | None = None,
        prefill: str | None = None,
    ) -> None:
        self.model, self.device, self.cuda = model, device, device.startswith("cuda")
        if prefill is None:  # the worker's mode; padded without a graph runs unpadded, as before packing
            mode = prefill_mode()
            prefill = "unpadded" if mode == "padded" and not graph else mode
        if prefill not in (*PREFILL_MODES, "unpadded"):
            raise UsageError(
                f"DEEPGAP_SERVE_PREFILL={prefill}", "set it to packed or padded (or leave it unset)"
            )
        self.mode = prefill
        # a packed or padded prefill's sink row: past every slot
        rows = max_slots + 1 if prefill != "unpadded" else max_slots
        model.setup_cache(rows, cache_len)
        self.sink = max_slots
        g = torch.Generator().manual_seed(seed + 11)
        self.pool = pool
        width = padded_length(max_input, LENGTH_QUANTUM, cache_len)  # the longest padded prompt's
        self.ring = torch.randint(0, model.shape.vocab, (pool, width), generator=g).to(device)
        self.tok = torch.zeros((rows, 1), dtype=torch.int64, device=device)
        self.pos = torch.zeros(rows, dtype=torch.int64, device=device)
        self.act = torch.zeros(rows, dtype=torch.int64, device=device)
        self.steps = SlotSteps(self, graph, compile_mode)
        self.slots = max_slots
        self.prefills: BucketedPrefill | PackedPrefill | None = None
        # `Llama.prefill_packed` as the packed admissions run it, and its words ("" eager)
        self.packed, self.packed_how = packed_prefill(model, compile_mode if prefill == "packed" else None)
        if prefill == "packed":
            self.prefills = PackedPrefill(self, graph, max_input)
        elif prefill == "padded":
            self.prefills = BucketedPrefill(self, cache_len, graph)
        self.inputs = np.ones(1, dtype=np.int64)
        self.record: dict[int, list[int]] | None = None
        self.slot_req = np.full(max_slots, -1, dtype=np.int64)
        self.held = HeldRows(max_slots)  # the rows that may hold a sequence's position

    def set_level(self, slots: int, inputs: np.ndarray, record: bool = False) -> None:
        """A level's slot count and its requests' prompt lengths (arrival order)."""
        self.slots, self.inputs = slots, np.asarray(inputs, dtype=np.int64)
        self.record = {} if record else None
        self.slot_req[:] = -1
        self.held.clear()
        self.pos.zero_()  # every slot free: its row attends one position until a sequence is admitted there

    def prompt(self, r: int, length: int) -> Any:
        """Request ``r``'s prompt ids (on the device)."""
        return self.ring[r % self.pool, :length]

    def prefill(self, first: int, count: int, slots: list[int]) -> None:
        """Newcomers ``first … first+count-1`` into ``slots``: one right-padded prefill (bucketed where set)."""
        lens = self.inputs[first : first + count]
        ring_rows = [r % self.pool for r in range(first, first + count)]
        with torch.inference_mode():
            if self.prefills is None or not self.prefills(ring_rows, lens.tolist(), list(slots)):
                self._eager_prefill(ring_rows, lens, slots)
        self.slot_req[slots] = np.arange(first, first + count)
        self.held.admitted(slots)  # positions set: back to 0 at the next step that does not run them
        if self.record is not None:
            for s in slots:
                self.record[int(self.slot_req[s])] = [int(self.tok[s, 0])]
        self.sync()

    def _eager_prefill(self, ring_rows: list[int], lens: np.ndarray, slots: list[int]) -> None:
        rows = torch.as_tensor(ring_rows, device=self.device)
        ids = self.ring[rows, : int(lens.max())]
        where = torch.as_tensor(slots, device=self.device)
        dev_lens = torch.as_tensor(lens, device=self.device)
        logits = self.model.prefill_slots(ids, where, dev_lens)
        self.tok[where, 0] = logits.argmax(-1)
        self.pos[where] = dev_lens

    def decode(self, active: np.ndarray) -> None:
        """One step over the level's slots: a token for each, positions of the running ones advanced."""
        s = self.slots
        freed = self.held.freed(active)
        if len(freed):  # free rows attend one position, not their last sequence's whole context
            self.pos[torch.as_tensor(freed, device=self.device)] = 0
        self.act[:s].copy_(torch.as_tensor(active, dtype=torch.int64), non_blocking=False)
        with torch.inference_mode():
            self.steps(s)
        if self.record is not None:
            toks = self.tok[:s, 0].tolist()
            for slot in np.nonzero(active)[0].tolist():
                self.record[int(self.slot_req[slot])].append(toks[slot])
        self.sync()

    def sync(self) -> None:
        """Wait for the device (a CPU has nothing to wait for)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
