"""The simulator of a served decoder: measured prefill and decode-step curves on a virtual clock.

The worker calibrates two curves (`deepgap.serving.worker.llm_setup`): the **prefill** of ``b`` prompts padded
to ``P`` tokens (per calibrated batch size and prompt length), and the **decode step** over ``S`` slots (per
calibrated slot count). The decode step is the static one (`Llama.decode_slots`): it runs every slot, so its
time depends on the slots, not on how many sequences are running; its attention reads each row's cache up to
the row's position, so it is calibrated with every slot at the load's mean decode position
(`LlmLoad.decode_position`; half the cache before session 49). `LlmService` charges a prefill the median at
its batch and padded length (linear between calibrated points, proportional past the largest; a packed
server's, calibrated as one prompt per bucket of token rows, at the bucket of its total tokens) and a decode
step a draw from its slot count's measured steps, and `simulate_llm` runs the server's own loop
(`deepgap.serving.sim.continuous.serve_continuous`) on a `VirtualClock` with the same requests
(`LlmLoad.draw`: the real level's lengths, seeded alike).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from deepgap.serving.sim.clock import VirtualClock
from deepgap.serving.sim.continuous import SlotStop, TokenLog, serve_continuous
from deepgap.serving.sim.packing import groups, padded_length, smallest_bucket
from deepgap.serving.sim.seqlen import SeqLenDist


@dataclass(frozen=True)
class LlmLoad:
    """A decoder's requests: input (prompt) and output lengths, each from a stated distribution."""

    inputs: SeqLenDist
    outputs: SeqLenDist

    @property
    def cache_len(self) -> int:
        """Positions a slot's cache needs: the longest prompt and the longest output."""
        return self.inputs.max_len + self.outputs.max_len

    def decode_position(self) -> int:
        """The position a running sequence's decode step attends up to, on average over every decode step.

        Why: the decode attention reads each row's cache only up to its position (`deepgap.measure.llm_attention`),
        so a step's time grows with the positions its rows hold; the calibration runs every slot there. A request
        of ``I`` in and ``O`` out decodes at positions ``I … I+O−2`` (its first token is the prefill's), so over
        the steps: ``E[I] + E[(O−1)(O−2)/2] / E[O−1]``, the lengths drawn apart.
        """
        outs, p = self.outputs.support()
        steps = np.maximum(outs - 1, 0).astype(np.float64)
        walk = float(p @ (steps * (steps - 1) / 2) / (p @ steps)) if p @ steps > 0 else 0.0
        return int(round(self.inputs.mean() + walk))  # at most the longest prompt plus the longest output − 2

    def draw(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(input, output) lengths of ``n`` requests: the same ``(n, seed)`` gives the same everywhere."""
        return self.inputs.draw(n, seed), self.outputs.draw(n, seed + 1)

    def label(self) -> str:
        """``in uniform:64:256, out fixed:128``."""
        return f"in {self.inputs.label()}, out {self.outputs.label()}"


@dataclass
class LlmService:
    """Prefill seconds per (batch, prompt length) and decode-step seconds per slot count, measured."""

    prefill: dict[int, dict[int, np.ndarray]]  # prompt length → batch → seconds of each calibration prefill
    decode: dict[int, np.ndarray]  # slots → seconds of each calibration decode step
    cache_len: int
    source: str = ""
    counts: tuple[int, ...] = ()  # a bucketed server's newcomer counts (`serving.worker.llm_prefill`)
    quantum: int = 0  # and the multiple its prompts are padded to; 0: padded to the longest only
    # a packed server's buckets of token rows (`serving.sim.packing`), calibrated as one prompt of each
    # bucket's rows (``prefill[T][1]``), and the most prompts one packed prefill takes; () and 0: not packed
    tokens: tuple[int, ...] = ()
    prompts: int = 0
    # where the decode curve was timed (every slot at this position, `LlmLoad.decode_position`) and the median
    # step per slot count with every slot at position 0; 0 and {}: a step costs the curve's, wherever its rows
    position: int = 0
    decode_at_zero: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.prefill or not self.decode:
            raise ValueError("a decoder's service needs prefill and decode-step curves")
        self.lengths = tuple(sorted(self.prefill))
        self.batches = tuple(sorted(next(iter(self.prefill.values()))))
        self._pre = np.asarray(
            [[float(np.median(self.prefill[v][b])) for b in self.batches] for v in self.lengths]
        )
        self._dec = {s: float(np.median(x)) for s, x in self.decode.items()}
        self._ratios = {s: np.asarray(x, dtype=np.float64) / self._dec[s] for s, x in self.decode.items()}
        if (self._pre <= 0).any() or any(m <= 0 for m in self._dec.values()):
            raise ValueError("service times must be positive")

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The calibrated slot counts (the policies a capacity search tries)."""
        return tuple(sorted(self.decode))

    @property
    def max_batch(self) -> int:  # noqa: D102
        return self.batch_sizes[-1]

    def prefill_s(self, k: int, length: int) -> float:
        """Median seconds to prefill ``k`` prompts padded to ``length`` (interpolated; linear past the grid).

        A bucketed server (``counts``) runs ``k`` newcomers as the smallest bucket that holds them, padded to
        a multiple of ``quantum`` positions: that bucket is charged, not a line between two calibrated
        counts (session 20's 8B run: five newcomers ran as eight, and the simulator, charging about five,
        predicted 107.5 queries/s where 82.7 passed).
        """
        if self.counts and k <= self.counts[-1]:  # more newcomers run eager, unpadded
            k = smallest_bucket(k, self.counts)
            if self.quantum:
                length = padded_length(length, self.quantum, self.cache_len)
        ls, bs = self.lengths, self.batches
        at_len = [float(np.interp(length, ls, self._pre[:, j])) for j in range(len(bs))]
        if length > ls[-1]:
            at_len = [t * length / ls[-1] for t in at_len]
        if k > bs[-1]:
            return at_len[-1] * k / bs[-1]
        return float(np.interp(k, bs, at_len))

    def admission_s(self, lens) -> float:
        """Median seconds of the prefill of one admission, prompts of ``lens`` tokens (arrival order).

        A packed server (``tokens``) runs it as one packed prefill per group (`serving.sim.packing.groups`),
        each at the bucket of its total tokens: charged that bucket's calibrated time, not the count times
        the longest. Any other server: ``prefill_s(count, longest)``.
        """
        lens = [int(v) for v in lens]
        if not self.tokens:
            return self.prefill_s(len(lens), max(lens))
        runs = groups(lens, self.tokens[-1], self.prompts)
        return sum(self.prefill_s(1, smallest_bucket(sum(lens[a:b]), self.tokens)) for a, b in runs)

    def decode_s(self, slots: int, u: float | None = None) -> float:
        """Seconds of one decode step over ``slots`` (a calibrated count); ``u`` ∈ [0, 1) picks a sample."""
        med = self._dec[slots]
        if u is None:
            return med
        r = self._ratios[slots]
        return med * float(r[int(u * len(r))])

    def decode_times(
        self, slots: int, k: int, u: np.ndarray | None, read: np.ndarray | None = None
    ) -> np.ndarray:
        """Seconds of ``k`` decode steps over ``slots``: the median, or the samples ``u`` ∈ [0, 1) pick.

        ``read``: each step's positions summed over its rows (a free row's is 0). Where the curve was timed at
        a position with every slot there and at position 0 too (`positions_known`), a step's median is the
        line between the two at its share of the timed positions: the attention reads each row up to its
        position, the rest of the step costs the same.
        """
        med = np.full(k, self._dec[slots])
        if read is not None and self.positions_known(slots):
            zero = self.decode_at_zero[slots]
            med = zero + (med - zero) * np.asarray(read, dtype=np.float64) / (slots * self.position)
        if u is None:
            return med
        r = self._ratios[slots]
        return med * r[(u * len(r)).astype(np.int64)]

    def positions_known(self, slots: int) -> bool:
        """Whether ``slots``' steps were timed at a position and at position 0 (`decode_times`' line)."""
        return self.position > 0 and slots in self.decode_at_zero

    def saturation_qps(self, slots: int, load: LlmLoad) -> float:
        """Requests/s no server of ``slots`` can pass on these curves: an upper bound, the search's ceiling.

        A second of serving is decode steps and prefills. A request needs ``output − 1`` tokens from steps of
        at most ``slots`` rows, and its prompt prefilled; at best every step is full and every prompt is
        prefilled at the cheapest per-prompt batch (unpadded, at the mean length), so
        ``slots / ((output − 1) · step + slots · prefill_per_prompt)``. Poisson arrivals admit prompts a few
        at a time, padded to the longest, each prefill stalling every slot: the sustainable rate is lower.
        """
        mean_in = int(round(load.inputs.mean()))
        batches = [b for b in self.batches if b <= slots] or [slots]
        per_prompt = min(self.prefill_s(b, mean_in) / b for b in batches)
        if self.tokens:  # packed: the cheapest bucket per token row, at the mean prompt's rows
            per_prompt = mean_in * min(self.prefill_s(1, t) / t for t in self.tokens)
        return slots / ((load.outputs.mean() - 1) * self.decode_s(slots) + slots * per_prompt)


class HeldRows:
    """Which slots' rows may hold a sequence's position, so that a freed row goes back to position 0.

    Why one rule for both executors: the decode attention reads each row up to its position, so a freed row
    left at its last sequence's position would re-read that context every step. The real executor
    (`deepgap.serving.worker.llm_executor.SlotExecutor`) and the simulator's (`VirtualSlots`) put the same rows
    back at 0: those admitted or running since the last step that the step about to run does not run.
    """

    def __init__(self, slots: int) -> None:
        self.held = np.zeros(slots, dtype=bool)

    def admitted(self, slots) -> None:
        """``slots`` got a prompt: their positions are its length."""
        self.held[list(slots)] = True

    def freed(self, active: np.ndarray) -> np.ndarray:
        """The rows to put back at 0 before a step that runs ``active`` (the first ``len(active)`` slots)."""
        n = len(active)
        gone = np.nonzero(self.held[:n] & ~active)[0]
        self.held[:n] = active
        return gone

    def clear(self) -> None:
        """Every slot free (a new level)."""
        self.held[:] = False


class VirtualSlots:
    """The server's executor on a virtual clock: a prefill or a decode step advances it by its time."""

    def __init__(self, service: LlmService, clock: VirtualClock, slots: int, inputs, draws) -> None:
        self.sv, self.clock, self.slots, self.inputs = service, clock, slots, inputs
        self._u = None if draws is None else np.asarray(draws, dtype=np.float64)
        self.k = 0
        # each slot's position as the real executor keeps it (`SlotExecutor`): the prompt's length once
        # admitted, one more a step, back to 0 once its sequence retired
        self.pos = np.zeros(slots, dtype=np.int64)
        self.held = HeldRows(slots)

    def prefill(self, first: int, count: int, slots) -> None:  # noqa: D102
        self.pos[list(slots)] = self.inputs[first : first + count]
        self.held.admitted(slots)
        self.clock.advance(self.sv.admission_s(self.inputs[first : first + count]))

    def decode(self, active) -> None:  # noqa: D102
        self.decode_steps(1, np.inf, active)

    def decode_steps(self, k: int, until_s: float, active) -> int:
        """Up to ``k`` steps over the ``active`` rows, stopping after the first that ends at or past ``until_s``.

        Returns how many ran. The clock's sums are the one-at-a-time ones (a sequential cumulative sum from
        now); each step's positions (`LlmService.decode_times`' ``read``) advance by the running rows.
        """
        u = None if self._u is None else self._u[(self.k + np.arange(k)) % len(self._u)]
        active = np.asarray(active, dtype=bool)
        self.pos[self.held.freed(active)] = 0
        read = int(self.pos.sum()) + np.arange(k) * int(active.sum())
        ts = self.sv.decode_times(self.slots, k, u, read)
        ends = np.cumsum(np.concatenate(([self.clock.now()], ts)))[1:]
        ran = min(k, int(np.searchsorted(ends, until_s, "left")) + 1)
        self.k += ran
        self.pos[active] += ran
        self.clock.sleep_until(float(ends[ran - 1]))
        return ran


def simulate_llm(
    arrivals_s,
    load: LlmLoad,
    slots: int,
    service: LlmService,
    seed: int,
    stop: SlotStop | None = None,
    draw_seed: int | None = 0,
) -> TokenLog:
    """The level on a virtual clock: its requests' lengths drawn with ``seed`` as the real level's are.

    ``draw_seed``: the decode steps' times are drawn from the measured ones (None: their median).
    """
    arr = np.asarray(arrivals_s, dtype=np.float64)
    ins, outs = load.draw(len(arr), seed)
    clock = VirtualClock()
    draws = np.random.default_rng(draw_seed).random(4096) if draw_seed is not None else None
    return serve_continuous(
        arr, ins, outs, slots, clock, VirtualSlots(service, clock, slots, ins, draws), stop
    )
