"""What one result carries beyond its statistics, as typed records: the store's ``extra_json`` column.

Every key below is a typed optional field; `ResultDetails.to_json` writes exactly the JSON object the
store always held (same keys, same order, nulls where a producer wrote them), and `from_json` reads it
back, keeping unknown keys (an older or newer deepgap, a hand-edited store) in ``other`` so that a
round trip loses nothing. Key inventory (producer → readers; "record" = kept for the record only):

* ``traceback`` (worker: a failed configuration) → record.
* ``setup_s``, ``windows`` (`Window`), ``ci_halfwidth_rel``, ``torch_threads``, ``transfer`` (worker)
  → record.
* ``engine_info`` (`EngineInfo`, the engine's ``Prepared.info``; worker) → analysis.quant_layers.
* ``correctness`` (`Correctness`; worker) → analysis.frame, analysis.accuracy, report_answer, commands.show.
* ``telemetry`` (`TelemetryDetails`), ``flags`` (telemetry.measuring; ``flags`` also store.recover, for a
  damaged row) → analysis.frame, analysis.thermal, serving.capacity.planner, commands.show, worker.
* ``prepare_peak_mem_bytes`` (`MemoryPeaks`), ``device_mem_used`` (`DeviceMemUsed`) (worker, CUDA) → record.
* ``min_accuracy``, ``accuracy`` (`Accuracy`) (accuracy.evaluate) → analysis.accuracy, commands.show.
* ``thermal`` (telemetry.measuring's warm-up result, never a stored result) → drive.prelude.
* ``decode`` (`Decode`; measure.decode_config) → store.decode_frame, analysis.decode, commands.show/export.
* ``lane``, ``node_id``, ``node_env`` (fleet: the lane and its environment fingerprint, a dict like a
  run's ``env``; ``node_env`` also drive.sweep.host_cpu_results: the host CPU's, in a GPU run), ``attempts``, ``lost``
  (fleet.ray_backend) → store.results_frame, fleet.

A record is either built by a producer (a None field is then left out, except the keys it always
writes: `JsonRecord.ALWAYS`) or read by `from_json` (then exactly the keys read are written back, in
their order, nulls included). This module imports nothing else from deepgap.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="JsonRecord")


@dataclass
class JsonRecord:
    """A JSON object: declared keys as fields, unknown keys in ``other``, the keys read in ``keys_read``."""

    NESTED: ClassVar[dict[str, type[JsonRecord]]] = {}  # field → record type (a list of them for list values)
    ALWAYS: ClassVar[tuple[str, ...]] = ()  # fields a producer writes even when None

    other: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)
    keys_read: tuple[str, ...] | None = field(default=None, kw_only=True, repr=False, compare=False)

    @classmethod
    def declared(cls) -> tuple[str, ...]:
        """The declared JSON keys, in the order a producer writes them."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("other", "keys_read"))

    @classmethod
    def from_json(cls, d: dict[str, Any]):
        """Read a parsed JSON object; a value of the wrong shape for a nested record stays in ``other``."""
        names = set(cls.declared())
        kw: dict[str, Any] = {}
        other: dict[str, Any] = {}
        for k, v in d.items():
            if k not in names:
                other[k] = v
                continue
            rec = cls.NESTED.get(k)
            if rec is None:
                kw[k] = v
            elif isinstance(v, dict):
                kw[k] = rec.from_json(v)
            elif isinstance(v, list) and all(isinstance(x, dict) for x in v):
                kw[k] = [rec.from_json(x) for x in v]
            else:
                other[k] = v
        return cls(**kw, other=other, keys_read=tuple(d))

    def _written(self, name: str) -> bool:
        """Whether a declared field is written: set, read from JSON, or always written by its producer."""
        if self.keys_read is not None:
            return name in self.keys_read or getattr(self, name) is not None
        return getattr(self, name) is not None or name in self.ALWAYS

    def to_json(self) -> dict[str, Any]:
        """The JSON object (a dict of JSON values; the store serializes it with ``default=str``)."""
        declared = self.declared()
        order = [*(self.keys_read or ()), *declared, *self.other]
        out: dict[str, Any] = {}
        for k in order:
            if k in out:
                continue
            if k in self.other and (k not in declared or getattr(self, k) is None):
                out[k] = self.other[k]
            elif k in declared and self._written(k):
                out[k] = _dump(getattr(self, k))
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """A key by its JSON name, declared or not (for keys whose meaning belongs to one producer)."""
        if key in self.declared() and getattr(self, key) is not None:
            return getattr(self, key)
        return self.other.get(key, default)

    @classmethod
    def of(cls: type[R], x: R | dict[str, Any] | None) -> R:
        """``x`` as a record: a parsed JSON object is read, None (an empty column) is read as ``{}``."""
        return x if isinstance(x, cls) else cls.from_json(x if isinstance(x, dict) else {})


def _dump(v: Any) -> Any:
    if isinstance(v, JsonRecord):
        return v.to_json()
    if isinstance(v, list):
        return [_dump(x) for x in v]
    return v


@dataclass
class Correctness(JsonRecord):
    """The output check against the fp32 reference (``correctness.Agreement``, as stored)."""

    rel_l2: float | None = None
    cosine: float | None = None
    top1_agreement: float | None = None
    top5_overlap: float | None = None
    n_images: int | None = None
    bound_rel_l2: float | None = None
    flagged: bool | None = None
    weights: str | None = None  # "random" | "state-dict"; absent in stores from before it was recorded
    degenerate: str | None = None  # "all-zero logits" | "constant logits" (`correctness.degenerate`)


@dataclass
class MemoryPeaks(JsonRecord):
    """The torch allocator's peaks during the set-up (compile, capture, calibration), before the run's."""

    allocated: int | None = None
    reserved: int | None = None


@dataclass
class DeviceMemUsed(JsonRecord):
    """The two NVML readings `Result.device_mem_used_bytes` is the larger of (None: not read)."""

    ALWAYS: ClassVar[tuple[str, ...]] = ("final_bytes", "sampled_max_bytes")
    final_bytes: int | None = None  # read once after the protocol
    sampled_max_bytes: int | None = None  # the telemetry sampler's highest reading


@dataclass
class Window(JsonRecord):
    """One pipelined window of the timing protocol: back-to-back iterations and their seconds."""

    ALWAYS: ClassVar[tuple[str, ...]] = ("iterations", "seconds")
    iterations: int | None = None
    seconds: float | None = None


@dataclass
class EngineInfo(JsonRecord):
    """An engine's account of its set-up (``Prepared.info``).

    The set-up times, artifact caches and calibration are common to several engines and typed here;
    what only one engine knows (the quant engine's ``stem``, tile and tuning facts, TensorRT's build
    facts, Inductor's graph breaks …) stays in ``other``, read with `get`: its meaning is that engine's.
    """

    compile_s: float | None = None  # torch.compile
    capture_s: float | None = None  # CUDA graph capture
    export_s: float | None = None  # ONNX export (a cache miss only)
    quantize_s: float | None = None  # ONNX Runtime quantization (a cache miss only)
    session_s: float | None = None  # ONNX Runtime session creation
    onnx_cache: str | None = None  # "hit" | "miss"
    quant_cache: str | None = None  # "hit" | "miss"
    calibration: dict[str, Any] | None = None  # where the int8/fp8 ranges came from (calibration.py)
    layers: list[dict[str, Any]] | None = None  # quant engine: every planned layer, timed in the batch
    outside_layers: list[dict[str, Any]] | None = None  # quant engine: stem and head, timed alike


@dataclass
class TelemetryKeys:
    """The keys of one configuration's telemetry, in their stored order, declared once.

    Every key is optional here, as a stored row may lack it; the worker's aggregate
    (``measure.telemetry.base.TelemetryWindow``) narrows the ones it always fills, and `TelemetryDetails`
    (what is stored) adds the session's settings and memory reading.
    """

    backend: str | None = None
    status: str | None = None  # ok | unavailable: <reason>
    n_samples: int | None = None  # every sample of the configuration (warm-up, latency pass, windows)
    n_window_samples: int | None = None
    energy_windows: int | None = None
    energy_window_s: float | None = None  # seconds of work inside the windows (tails excluded)
    energy_tail_s: float | None = None  # idle seconds waited after windows for the counter to tick
    energy_tail_j: float | None = None  # tail energy at the idle power, subtracted from energy_j
    energy_j: float | None = None
    energy_source: str | None = None
    energy_counter_notes: list[str] | None = None  # wrap / reset / missing readings
    images: int | None = None  # images processed inside the windows
    joules_per_image: float | None = None
    mean_power_w: float | None = None  # sampled driver power inside the windows
    max_power_w: float | None = None
    mean_power_instant_w: float | None = None
    max_power_instant_w: float | None = None
    power_from_energy_w: float | None = None  # energy_j / energy_window_s
    mean_power_latency_w: float | None = None  # sampled power during the synchronized latency pass
    ips_per_watt: float | None = None  # the paper's formula: pipelined throughput / mean_power_w
    ips_per_watt_energy: float | None = None  # images / energy_j
    idle_power_w: float | None = None
    dynamic_energy_j: float | None = None  # energy_j minus idle_power_w × energy_window_s
    dynamic_joules_per_image: float | None = None
    max_temp_c: float | None = None
    max_mem_temp_c: float | None = None
    temp_start_c: float | None = None
    temp_end_c: float | None = None
    temp_slope_c_per_min: float | None = None
    sm_clock_median_mhz: float | None = None  # busy samples only (gpu_idle reason excluded)
    sm_clock_min_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    sm_clock_ref_mhz: float | None = None  # the steady level the flag compares against
    sm_clock_low_fraction: float | None = None
    mem_clock_median_mhz: float | None = None
    util_mean_pct: float | None = None
    mem_used_max_bytes: int | None = None
    throttle_reasons: list[str] | None = None  # decoded names seen inside the windows
    throttle_fraction: dict[str, float] | None = None  # name → share of window samples
    foreign_procs_max: int | None = None
    foreign_pids: list[int] | None = None
    unavailable: dict[str, str] | None = None
    settings: dict[str, Any] | None = None  # the device's read-only settings (power limit, clocks …)
    marks: list[dict[str, Any]] | None = None  # the raw energy-counter readings per window


@dataclass
class TelemetryDetails(TelemetryKeys, JsonRecord):
    """``telemetry.base.TelemetryWindow`` as stored, plus the session's settings and memory reading.

    When telemetry was off or unavailable only ``status`` and ``backend`` are written.
    """

    sample_hz: float | None = None
    energy_window_min_s: float | None = None
    window_extended: bool | None = None
    max_device_mem_used_bytes: int | None = None


@dataclass
class Accuracy(JsonRecord):
    """Top-1/top-5 on a labelled dataset against fp32 eager (accuracy.evaluate); or why there is none."""

    top1: float | None = None
    top5: float | None = None
    top1_fp32: float | None = None
    top5_fp32: float | None = None
    top1_relative: float | None = None
    top1_agreement_fp32: float | None = None
    n: int | None = None
    subset: str | None = None
    dataset_sha: str | None = None
    min_relative: float | None = None
    reference: str | None = None
    error: str | None = None  # the data pass failed; the timing stands
    traceback: str | None = None


@dataclass
class Decode(JsonRecord):
    """A decode configuration's figures (`deepgap.measure.decode_config`; docs/llm.md gives each one).

    Times in seconds, rates in tokens/s, memory in bytes; ``tpot_tail_kind`` says whether the tail is a
    p99 (n ≥ 368) or the maximum of n. The analytic roofline (``bytes_per_token``, ``flops_per_token``)
    is `deepgap.measure.llm_cost.decode_cost` at ``cost_context``, the generation's mean context.
    """

    input_len: int | None = None
    output_len: int | None = None
    step: str | None = None  # the `llm_steps` kind the engine ran ("eager", "compile", "cuda-graph")
    compile_mode: str | None = None
    pdl: str | None = None  # the graph's launch: "on"/"off" and why (`llm_steps._kept`; DEEPGAP_DECODE_PDL)
    # how the prompt ran: "compiled (mode)" or "eager" (`llm_steps.make_prefill`); None: stored before
    # session 44, when every prefill ran eager
    prefill: str | None = None
    attention: str | None = (
        None  # the static step's: "sdpa", "one pass", "split …", "in the qkv GEMV's …" (`llm_attention.describe`)
    )
    tiles: str | None = None  # the GEMV tiles the worker's tuner had chosen (`quant.gemv.chosen`), quant only
    # RoPE's cos and sin: "one kernel" (`llm_angles`, the default since session 53) or "formula" (torch's, or
    # Inductor's in a compiled step); None: stored before session 53, when every step ran the formula
    angles: str | None = None
    runs: int | None = None  # timed generations
    warmup_runs: int | None = None
    ttft_median_s: float | None = None
    ttft_n: int | None = None
    tpot_median_s: float | None = None
    tpot_n: int | None = None
    tpot_tail_s: float | None = None
    tpot_tail_kind: str | None = None  # "p99" | "max"
    e2e_median_s: float | None = None
    decode_tok_s: float | None = None
    pipelined_decode_tok_s: float | None = None
    output_tok_s: float | None = None
    total_tok_s: float | None = None
    kv_cache_bytes: int | None = None
    weight_bytes: int | None = None
    bytes_per_token: float | None = None
    flops_per_token: float | None = None
    cost_context: float | None = None
    joules_per_token: float | None = None  # energy of the pipelined decode windows / their tokens
    energy_window_s: float | None = None
    tokens_checked: int | None = None  # greedy tokens compared with the fp32 reference's (rows × first N)
    token_agreement: float | None = None  # share of them equal
    first_mismatch: int | None = None  # the first output position where a row differs (None: none)


@dataclass
class TextBatch(JsonRecord):
    """A mixed-length text batch's make-up (``--inputs packed``/``padded``, `deepgap.core.records.TEXT_INPUTS`).

    Why stored: tokens/s and J/token count real tokens (``tokens_per_sample``), not the sequence length,
    and what padding cost shows as the padded row's ``padded_tokens_per_sample`` against it.
    """

    lengths: str = ""  # the distribution the batch was drawn from, as ``--seq-len-dist`` spells it
    tokens_per_sample: float | None = None  # real tokens per sequence of the timed batch (its mean length)
    padded_tokens_per_sample: float | None = None  # tokens each sequence is computed over (packed: as real)
    longest: int | None = None  # the batch's longest sequence (the padded width)
    attention: str | None = None  # how attention ran over the batch (varlen kernel, padded SDPA with a mask)


def real_tokens(details: Any) -> float:
    """A row's real tokens per sequence where its batch had mixed lengths (`TextBatch`), else NaN."""
    text = getattr(details, "text_batch", None)
    v = getattr(text, "tokens_per_sample", None)
    return float(v) if isinstance(v, int | float) and v > 0 else float("nan")


@dataclass
class ResultDetails(JsonRecord):
    """Everything a `records.Result` carries beyond its statistics; the field order is the write order."""

    NESTED: ClassVar[dict[str, type[JsonRecord]]] = {
        "engine_info": EngineInfo,
        "correctness": Correctness,
        "windows": Window,
        "telemetry": TelemetryDetails,
        "prepare_peak_mem_bytes": MemoryPeaks,
        "device_mem_used": DeviceMemUsed,
        "accuracy": Accuracy,
        "decode": Decode,
        "text_batch": TextBatch,
    }

    traceback: str | None = None  # a failed configuration's traceback
    setup_s: float | None = None  # the engine's prepare (export, compile, capture, calibration)
    engine_info: EngineInfo | None = None
    correctness: Correctness | None = None
    windows: list[Window] | None = None
    ci_halfwidth_rel: float | None = None  # written with ``windows``, null when no CI was targeted
    torch_threads: int | None = None
    transfer: str | None = None  # what host→device copy was timed (``include_transfer``, ``input_mode`` only)
    telemetry: TelemetryDetails | None = None
    flags: list[str] | None = None  # contamination flags (throttling, foreign processes, recovered rows)
    prepare_peak_mem_bytes: MemoryPeaks | None = None
    device_mem_used: DeviceMemUsed | None = None
    min_accuracy: float | None = None  # the run's --min-accuracy
    accuracy: Accuracy | None = None
    thermal: dict[str, Any] | None = None  # the run-level thermal warm-up's summary (telemetry.thermal)
    lane: str | None = None  # fleet: the lane that measured it
    node_id: str | None = None  # fleet (Ray): the node
    node_env: dict[str, Any] | None = None  # fleet: the lane's environment fingerprint (as a run's env)
    attempts: int | None = None  # fleet (Ray): submissions of the task
    lost: list[str] | None = None  # fleet (Ray): why earlier submissions were lost
    decode: Decode | None = None  # a decode configuration's figures (`Decode`)
    text_batch: TextBatch | None = None  # a mixed-length text input's make-up (`TextBatch`)

    def _written(self, name: str) -> bool:
        if name == "ci_halfwidth_rel" and self.keys_read is None:
            return self.windows is not None or self.ci_halfwidth_rel is not None
        return super()._written(name)

    @classmethod
    def of(cls, x: ResultDetails | dict[str, Any] | None) -> ResultDetails:
        """``x`` as details: a parsed JSON object is read, None (no details) is empty."""
        if isinstance(x, ResultDetails):
            return x
        return cls.from_json(x) if isinstance(x, dict) else cls()
