"""What a serving row carries beyond its columns, as typed records: the serving tables' ``extra_json``.

The tables are ``serve_curves``, ``serve_runs`` and ``capacity`` (`deepgap.serving.records.storage`).

Same pattern as `deepgap.core.result_details` (whose `JsonRecord` these build on): every key is a typed
optional field in the order its producer writes it, `to_json` writes exactly the JSON object the store
always held, and `from_json` keeps unknown keys (an older or newer deepgap) so that a round trip loses
nothing. Key inventory (producer → readers; "record" = kept for the record only):

* `CurveDetails` (``serve_curves``; serving.run.rows.curve_rows): ``includes`` (what a calibrated sample
  spans), ``host_s``, ``interval_s``, ``engine_s`` (the worker's mean parts of one batch),
  ``engine_burst_s``, ``seq_len`` (a text model's padded length; ``resolution`` holds it too) → record.
* `LevelDetails` (``serve_runs``; serving.run.rows.level_row, serving.run.scenarios, serving.run.loadgen_run):
  ``threads`` (a tenant's CPU threads) → tests; ``loadgen_summary``, ``loadgen`` (LoadGen's summary
  text and its parsed key/values) → record, the report's LoadGen table; ``loadgen_run`` (`LoadgenRun`:
  settings, early stopping, the per-sample comparison with LoadGen's trace) → the report's LoadGen
  table; ``n_dropped``, ``host_mean_s``, ``predicted_verdict`` →
  record; ``correctness``, ``notes``, ``engine_info``, ``device_mem_used_bytes_at_setup``, ``accuracy``
  (the worker's set-up, copied onto each level of a one-model run) → record, tests; ``seq_len_dist``,
  ``padding``, ``useful_tokens_per_s``, ``padded_tokens_per_s``, ``padding_fraction``,
  ``predicted_useful_tokens_per_s`` (a text model's level) → the console, ``show``.
* `CapacityDetails` (``capacity``; serving.run.scenarios): ``probes`` (`CapacityProbe`, every rate the
  search tried), ``verified`` (a simulated policy that was also measured) → record, tests.
* ``kv_cache`` (each of the three; serving.run.rows, serving.run.llm_run): a served decoder's cache format
  where it is not the decoder's own dtype ("fp8", ``--kv-cache``), written only then, so every row of a
  store from before it reads as before → serving.show.tables (``show``, the report, ``export``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from deepgap.core.result_details import Accuracy, Correctness, EngineInfo, JsonRecord


@dataclass
class CurveDetails(JsonRecord):
    """One calibrated batch size beyond its columns: what a sample spans and the worker's mean parts."""

    ALWAYS: ClassVar[tuple[str, ...]] = ("includes",)

    includes: str | None = None  # the steps one calibration sample times
    host_s: float | None = None  # mean host-side seconds of a batch (pipelined engines)
    interval_s: float | None = None  # mean seconds between batch completions at the serving depth
    # mean seconds inside the engine, held ≥ 1 s back to back on a GPU where its burst is within 10% of the best
    # batch's rate (`server.HOLD_WITHIN`; None at the other batch sizes there, since session 47)
    engine_s: float | None = None
    engine_burst_s: float | None = None  # the same over a burst of a few batches (boost clocks)
    seq_len: int | None = None  # a text model: the padded length every request of the batch had
    # a text model: every calibrated padded length's samples and interval at this batch size (the key
    # of ``serve_curves`` is one row per batch size; the row's own columns are the longest length's)
    seq_len_curves: dict[str, Any] | None = None
    workload: str | None = (
        None  # "decode": a decoder's decode step per slot count (prefill in seq_len_curves)
    )
    kv_cache: str | None = None  # a decoder's cache format where not its own dtype: "fp8" (``--kv-cache``)


@dataclass
class LoadgenRun(JsonRecord):
    """One LoadGen run beyond its summary: what it was asked, early stopping, LoadGen against deepgap."""

    sut: str | None = None  # "batched" (the served engine) | "null" (completes at once: the harness floor)
    min_duration_s: float | None = None
    min_queries: int | None = None
    early_stopping: str | None = None  # LoadGen's early-stopping lines
    complete_calls: int | None = None  # QuerySamplesComplete calls (one per batch)
    issue_calls: int | None = None
    agree: bool | None = None  # per-sample LoadGen − deepgap p99 within margin_s (None: not traced)
    margin_s: float | None = None
    diff_p50_s: float | None = None
    diff_p99_s: float | None = None
    issue_delay_p99_s: float | None = None  # LoadGen's scheduled → issue start
    trace_note: str | None = None  # why there is no per-sample comparison


@dataclass
class LlmLevel(JsonRecord):
    """A served decoder's level (`deepgap.serving.sim.token_stats.TokenStats`) and its simulation.

    TTFT and TPOT each with a median and a tail: ``*_tail_kind`` "p99" only where n ≥ 368, else "max" (of
    the n requests; "≥ …" where a stop left requests queued, their waits lower bounds); tokens/s: every output
    token produced (partial outputs a stop left included) over the window first arrival → last token; the
    counts over each bound and their verdicts.
    """

    input_len_dist: str | None = None
    output_len_dist: str | None = None
    cache_len: int | None = None  # positions per slot: the longest prompt plus the longest output
    ttft_p50_s: float | None = None
    ttft_tail_s: float | None = None
    ttft_tail_kind: str | None = None
    ttft_n: int | None = None
    tpot_p50_s: float | None = None
    tpot_tail_s: float | None = None
    tpot_tail_kind: str | None = None
    tpot_n: int | None = None
    output_tokens_per_s: float | None = None
    input_tokens_per_s: float | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    n_over_ttft: int | None = None
    n_over_tpot: int | None = None
    ttft_verdict: str | None = None
    tpot_verdict: str | None = None
    slots: int | None = None
    decode_steps: int | None = None
    mean_active: float | None = None
    output_tokens: int | None = None  # produced in the window, partial outputs included
    window_s: float | None = None  # first arrival → last token
    n_unfinished: int | None = None  # admitted, still decoding when a stop ended the level
    n_queued: int | None = None  # still waiting for a slot then
    predicted_output_tokens_per_s: float | None = None
    predicted_ttft_tail_s: float | None = None
    predicted_tpot_tail_s: float | None = None


@dataclass
class LevelDetails(JsonRecord):
    """One load level beyond its columns; the field order is the write order."""

    NESTED: ClassVar[dict[str, type[JsonRecord]]] = {
        "correctness": Correctness,
        "engine_info": EngineInfo,
        "accuracy": Accuracy,
        "loadgen_run": LoadgenRun,
        "llm": LlmLevel,
    }

    threads: int | None = None  # a tenant's CPU threads (only when set)
    loadgen_summary: str | None = None  # MLCommons LoadGen's summary text (a ``loadgen`` level)
    loadgen: dict[str, Any] | None = None  # its key/values, parsed
    loadgen_run: LoadgenRun | None = None  # its settings, early stopping, per-sample comparison
    n_dropped: int | None = None  # requests shed by the bounded queue (a measured level)
    host_mean_s: float | None = None  # mean host-side seconds per request
    predicted_verdict: str | None = None  # the simulator's SLO verdict for the same arrivals
    correctness: Correctness | None = None  # the worker's set-up: agreement with the fp32 reference
    notes: list[str] | None = None
    engine_info: EngineInfo | None = None
    device_mem_used_bytes_at_setup: int | None = None
    accuracy: Accuracy | None = None  # accuracy mode only
    # A text model's level (`deepgap.serving.sim.seqlen`): the lengths' distribution, the padding, and
    # tokens per second: the requests' own (useful) and what the engine ran (padded, padding included)
    seq_len_dist: str | None = None
    padding: str | None = None
    useful_tokens_per_s: float | None = None
    padded_tokens_per_s: float | None = None
    padding_fraction: float | None = None  # padded-in tokens / tokens run: 1 − useful / padded
    predicted_useful_tokens_per_s: float | None = None
    llm: LlmLevel | None = None  # a decoder's level: TTFT, TPOT, tokens/s (`LlmLevel`)
    # the served decoder's cache format where not its own dtype: "fp8" (``--kv-cache``,
    # `ConfigSpec.kv_cache`), beside the row's configuration columns (none holds it)
    kv_cache: str | None = None


@dataclass
class CapacityProbe(JsonRecord):
    """One rate the capacity search tried and what came of it (every key written, nulls included)."""

    ALWAYS: ClassVar[tuple[str, ...]] = ("rate_qps", "verdict", "n", "p99_s", "n_over_slo")

    rate_qps: float | None = None
    verdict: str | None = None
    n: int | None = None
    p99_s: float | None = None
    n_over_slo: int | None = None


@dataclass
class CapacityDetails(JsonRecord):
    """One capacity result beyond its columns: the search's probes and, for a simulated one, ``verified``."""

    NESTED: ClassVar[dict[str, type[JsonRecord]]] = {"probes": CapacityProbe}

    probes: list[CapacityProbe] | None = None
    verified: bool | None = None  # simulated only: whether the same policy was also measured
    # a decoder's capacity (``slo_s`` is its TTFT bound, ``max_batch`` its slots): the TPOT bound, and
    # at the capacity rate the output tokens/s and both tails (kind "p99" or "max" of n)
    slo_tpot_s: float | None = None
    output_tokens_per_s: float | None = None
    ttft_tail_s: float | None = None
    ttft_tail_kind: str | None = None
    tpot_tail_s: float | None = None
    tpot_tail_kind: str | None = None
    kv_cache: str | None = None  # the served decoder's cache format where not its own dtype: "fp8"
    # a decoder's: how its set-up prefilled admissions (`llm_tables.engine_cell`)
    admissions: str | None = None
    # an image or text server's engine alone at its best calibrated batch (`scenario_context.engine_details`):
    # its rate, that batch, how long it was held back to back (0: a short burst) and the burst's rate
    engine_ips: float | None = None
    engine_batch: int | None = None
    engine_held_s: float | None = None
    engine_burst_ips: float | None = None


ENGINE_RATIO_MAX = 1.02  # capacity ÷ the engine alone above this cannot be true of a steady server


def engine_ratio_note(ratio: float | None) -> str:
    """What a view appends to a capacity ÷ engine-alone ratio that cannot be true, else "".

    Why: a server runs the engine plus its copies and normalisation, so in steady state it cannot serve
    faster than the engine alone; a ratio above `ENGINE_RATIO_MAX` (the project's 2%) means the engine's
    figure is the wrong one, too low: a short burst on a busy host (a 2-core CPU read 1.31 once, 0.59–0.70 in
    the next two runs: session 47). The ratio is shown with this note, never plainly.
    """
    try:
        r = float(ratio)  # None or pd.NA: nothing to judge
    except (TypeError, ValueError):
        return ""
    if not r > ENGINE_RATIO_MAX:  # NaN fails too
        return ""
    return " (above the engine alone: that figure ran low)"
