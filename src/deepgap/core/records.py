"""Typed records that flow one way: `ConfigSpec` → worker → `Result` → store.

`ConfigSpec` is frozen and hashable: it is both the identity of a measurement (its `key` is the
store's natural key within a run, which makes ``--resume`` exact) and the grouping key of the
analysis. Units are in every field name (``_s``, ``_bytes``, ``_ips`` = images per second).
What a result carries beyond its statistics is a typed `ResultDetails` (``result_details``).
This module imports nothing else from deepgap.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any

from deepgap.core.result_details import ResultDetails


class Status(str, enum.Enum):
    """Outcome of one configuration. Every planned configuration ends with exactly one."""

    OK = "ok"
    OOM = "oom"  # the device ran out of memory
    SKIPPED = "skipped"  # not attempted; `reason` says why (unsupported precision, larger than an OOM …)
    ERROR = "error"  # an exception inside the worker; `reason` holds its message
    TIMEOUT = "timeout"  # the worker hung past the per-configuration timeout and was killed
    CRASH = "crash"  # the worker process died (segfault, abort, os._exit …)


# ConfigSpec fields kept in the configuration key only, not in a results column of their own: the
# results table is what every committed store holds (no migration), and ``seq_len`` is NULL for all of
# those; `deepgap.store.Store.results_frame` reads it back from the key.
# ``input_len``/``output_len``: a decoder's decode workload (issue 51; `SweepSpec.workload` "decode"), set
# only on decode configurations, so every forward key is unchanged; `Store.results_frame` leaves decode
# rows out (their latency is a decode step's, not a forward pass's) and `Store.decode_frame` reads them.
# ``kv_cache``: a decode configuration's KV-cache format (`KV_CACHE_LABELS`), set only where it is not the
# decoder's own dtype, so every key stored before the axis existed is unchanged.
KEY_ONLY_FIELDS = ("seq_len", "input_mode", "input_len", "output_len", "kv_cache")

# How the timed input reaches the engine (`ConfigSpec.input_mode`; the sweep's ``inputs`` axis, ``--inputs``).
# "default": a float batch in the engine's input dtype, on the device (None in a ConfigSpec, so every key
# stored before the axis existed is unchanged). "int8-resident": the images already quantized to int8 in
# device memory, in the engine's own layout (MLPerf Inference's closed-division condition: its
# preprocessing is untimed); the engine makes that input once, outside the timed window. A resident row is
# a configuration of its own: no view pools it with a default row, and it is never the answer.
#
# A text model's batch of mixed lengths (`TEXT_INPUTS`): its sequences' lengths are drawn, seeded, from the
# sweep's ``seq_len_dist`` (``--seq-len-dist``, the serve syntax; each length at most ``seq_len``), and the
# stored mode names them, "packed:uniform:64:384": rows of two distributions are two configurations.
# "packed": padding removed, every sequence's tokens end to end (MLPerf BERT's condition: its SQuAD
# sequences are padding-free); "padded": the same lengths padded to the batch's longest, padded keys
# masked (what a batch costs without removal). Tokens/s counts real tokens only (``tokens_per_sample``).
TEXT_INPUTS = ("packed", "padded")
INPUT_MODES = ("default", "int8-resident", *TEXT_INPUTS)
INPUT_MODE_LABELS = {
    "int8-resident": "int8 images resident in GPU memory, MLPerf-like",
    "packed": "padding removed, sequences packed end to end, MLPerf-like",
    "padded": "padded to the batch's longest sequence, padded keys masked",
}


def spec_input_mode(name: str | None, seq_len_dist: str | None = None) -> str | None:
    """A sweep's input name as a `ConfigSpec.input_mode`: "default" (or nothing) is None.

    A text input (`TEXT_INPUTS`) carries its lengths' distribution: ``packed`` and ``uniform:64:384`` give
    "packed:uniform:64:384".
    """
    if not name or name == "default":
        return None
    return f"{name}:{seq_len_dist}" if name in TEXT_INPUTS and seq_len_dist else name


def input_kind(mode: Any) -> str:
    """The input mode's kind: "default", "int8-resident", or a text input's "packed"/"padded"."""
    name = input_name(mode)
    head = name.split(":", 1)[0]
    return head if head in TEXT_INPUTS else name


def is_resident(mode: Any) -> bool:
    """Whether an input mode is made on the device by the engine (int8-resident), not a batch it is given."""
    return input_kind(mode) == "int8-resident"


def input_lengths(mode: Any) -> str | None:
    """A text input's distribution of lengths ("packed:uniform:64:384" → "uniform:64:384"); else None."""
    name = input_name(mode)
    head, _, dist = name.partition(":")
    return dist if head in TEXT_INPUTS and dist else None


def input_mode_label(mode: Any) -> str:
    """What an input mode means, for a view: its label, and a text input's lengths."""
    kind = input_kind(mode)
    label = INPUT_MODE_LABELS.get(kind, kind)
    dist = input_lengths(mode)
    return f"lengths {dist}, {label}" if dist else label


# A decode configuration's KV-cache format (`ConfigSpec.kv_cache`; the sweep's ``kv_caches`` axis,
# ``--kv-caches``, `deepgap.measure.llm_workload.KV_CACHES`): None is the decoder's own dtype. "fp8": e4m3
# codes at scale 1, saturating (vLLM's fp8 cache without calibration). A row with a cache format of its own
# is a configuration of its own: every view names it, so it never reads as a row in the decoder's dtype.
KV_CACHE_LABELS = {"fp8": "fp8 KV cache"}


def kv_cache_label(value: Any) -> str:
    """What a `ConfigSpec.kv_cache` (or a frame's ``kv_cache`` cell) means, for a view: "" for the default."""
    if not isinstance(value, str) or not value:
        return ""
    return KV_CACHE_LABELS.get(value, f"{value} KV cache")


def kv_cache_suffix(value: Any, sep: str = " ") -> str:
    """``sep`` + `kv_cache_label` where the cache has a format of its own, else "": for a label to append it to."""
    label = kv_cache_label(value)
    return f"{sep}{label}" if label else ""


def input_name(mode: Any) -> str:
    """A `ConfigSpec.input_mode` (or a frame's ``input_mode`` cell) as its name: None/""/NaN is "default"."""
    return mode if isinstance(mode, str) and mode else "default"


def _key_field(key: str, name: str) -> Any:
    """Field ``name`` of a stored configuration key (None: absent, or a key not in JSON)."""
    try:
        return json.loads(key).get(name)
    except (TypeError, ValueError, AttributeError):
        return None


@dataclass(frozen=True, order=True)
class ConfigSpec:
    """One point of a sweep: everything that changes what is measured."""

    model: str
    engine: str
    precision: str
    batch_size: int
    device: str
    memory_format: str = "nchw"
    threads: int | None = None  # CPU intra-op threads; None = torch's default
    resolution: int = 224
    sweep: int = 0  # the paper repeats the whole batch sweep; each pass is its own point
    include_transfer: bool = False  # time the host→device copy of pinned inputs too
    # A text model's sequence length (tokens per sample); None for image models ("not applicable").
    # ``resolution`` holds the same number for a text model (its input size), so caches and groupings
    # keyed by input size separate sequence lengths; this field marks the configuration as text.
    seq_len: int | None = None
    # How the timed input is given (`INPUT_MODES`); None = the default, a float batch in the engine's
    # ``input_dtype``. A key-only field like ``seq_len``.
    input_mode: str | None = None
    # A decode configuration (a Llama decoder's greedy generation): prompt tokens per sequence and output
    # tokens per sequence; None for a forward-pass configuration. ``resolution`` holds ``input_len``.
    input_len: int | None = None
    output_len: int | None = None
    # A decode configuration's KV-cache format (`KV_CACHE_LABELS`): None = the decoder's own dtype (every
    # configuration stored before the axis existed), "fp8" = e4m3 codes at scale 1. Key-only.
    kv_cache: str | None = None

    @property
    def is_decode(self) -> bool:
        """Whether this configuration measures decode (TTFT, TPOT) rather than a forward pass."""
        return self.output_len is not None

    @property
    def key(self) -> str:
        """Stable text identity, used as the store's unique key within a run.

        The key-only fields (``seq_len``, ``input_mode``, the decode lengths, ``kv_cache``) enter only where
        they are set, so the key of a configuration is what it was before the fields existed (stored runs
        resume and merge unchanged).
        """
        d = dataclasses.asdict(self)
        for k in KEY_ONLY_FIELDS:
            if d[k] is None:
                del d[k]
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @property
    def group(self) -> tuple[Any, ...]:
        """Everything but the batch size: an OOM at batch B skips larger batches of the same group."""
        d = dataclasses.asdict(self)
        d.pop("batch_size")
        return tuple(sorted(d.items()))

    def label(self) -> str:
        """Short human label for progress lines."""
        t = f" t{self.threads}" if self.threads else ""
        mf = "" if self.memory_format == "nchw" else f" {self.memory_format}"
        seq = f" seq{self.seq_len}" if self.seq_len else ""
        inp = f" {self.input_mode}" if self.input_mode else ""
        dec = f" decode {self.input_len}/{self.output_len}" if self.is_decode else ""
        kv = f" kv-{self.kv_cache}" if self.kv_cache else ""
        return f"{self.model} {self.engine}{mf} {self.precision} bs{self.batch_size}{seq}{inp}{dec}{kv}{t}"

    @staticmethod
    def seq_len_of(key: str) -> int | None:
        """The sequence length a stored key names (None: an image configuration, or a key not in JSON)."""
        v = _key_field(key, "seq_len")
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @staticmethod
    def input_mode_of(key: str) -> str | None:
        """The input mode a stored key names (None: the default input, or a key not in JSON)."""
        v = _key_field(key, "input_mode")
        return v if isinstance(v, str) and v else None

    @staticmethod
    def kv_cache_of(key: str) -> str | None:
        """The KV-cache format a stored key names (None: the decoder's own dtype, or a key not in JSON)."""
        if not isinstance(key, str) or '"kv_cache"' not in key:  # every key stored before the axis: no parse
            return None
        v = _key_field(key, "kv_cache")
        return v if isinstance(v, str) and v else None

    @staticmethod
    def decode_lens_of(key: str) -> tuple[int, int] | None:
        """(input length, output length) of a stored decode key; None for a forward configuration."""
        if not isinstance(key, str) or '"output_len"' not in key:  # every forward key: no JSON parse
            return None
        a, b = _key_field(key, "input_len"), _key_field(key, "output_len")
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (a, b))
        return (a, b) if ok else None

    @classmethod
    def from_key(cls, key: str) -> ConfigSpec:
        """Inverse of `key`."""
        return cls(**json.loads(key))


@dataclass(frozen=True)
class LatencyStats:
    """Summary of per-iteration latencies (seconds per batch) with bootstrap 95% CIs."""

    n: int
    mean_s: float
    std_s: float
    min_s: float
    p5_s: float
    median_s: float
    p90_s: float
    p95_s: float
    p99_s: float
    max_s: float
    median_ci_low_s: float
    median_ci_high_s: float
    p99_ci_low_s: float
    p99_ci_high_s: float


@dataclass
class Result:
    """What one configuration produced. Statistics are `None` unless ``status`` is OK."""

    spec: ConfigSpec
    status: Status
    reason: str = ""
    latency: LatencyStats | None = None
    throughput_ips: float | None = None  # batch / median synchronized latency (the paper's way)
    throughput_ci_low_ips: float | None = None
    throughput_ci_high_ips: float | None = None
    throughput_pipelined_ips: float | None = None  # back-to-back iterations, no sync in between
    n_repeats: int = 0
    warmup: int = 0
    cv_repeats: float | None = None  # coefficient of variation of the per-repeat medians
    target_ci: float | None = None
    ci_met: bool | None = None
    peak_mem_allocated_bytes: int | None = None  # this process's tensors (torch allocator)
    peak_mem_reserved_bytes: int | None = None  # this process's allocator pool
    device_mem_used_bytes: int | None = None  # device-wide NVML "used": context + other processes
    host_rss_bytes: int | None = None
    flops_per_image: float | None = None
    params: int | None = None
    weights_sha: str | None = None
    duration_s: float = 0.0
    started_at: float = 0.0
    samples_s: list[list[float]] = field(default_factory=list)  # per repeat, per iteration latencies
    details: ResultDetails = field(default_factory=ResultDetails)  # engine/telemetry/correctness details
    telemetry: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)  # (phase, t_s, sample)
