"""The shape of a Llama-architecture decoder: named shapes, HF ``config.json`` parsing, parameter counts.

Why a dataclass of our own and not ``transformers.LlamaConfig``: deepgap measures without transformers
installed (it is a test extra), and the count of parameters, bytes and FLOPs per token must come from
the shape alone, without building a module (an 8B model is 32 GB in fp32). The named shapes carry the
published ``config.json`` values of Meta's checkpoints (hidden, intermediate, layers, heads, KV heads,
vocabulary, RoPE theta and Llama-3's RoPE scaling, tied embeddings); `LlamaShape.hf_dict` writes them
back in Hugging Face's spelling, which is how `tests/measure/models/test_llm_model.py` builds the reference model.

A malformed or missing ``config.json`` is a `UsageError`: one line that names the file, the key and
what to do, raised before anything is built.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass

from deepgap.core.errors import UsageError

# Absurd-input bounds: a batch past this is a typo (the KV cache of an 8B model at batch 65,536 and
# 128 tokens is 1 TiB), and so is a cache beyond one TiB on one device.
MAX_LLM_BATCH = 65_536
MAX_CACHE_BYTES = 1 << 40


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3.1's frequency-dependent RoPE rescaling (``rope_type: llama3`` in config.json)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int


@dataclass(frozen=True)
class LlamaShape:
    """Every number that fixes a Llama decoder's tensors; the names say what, HF's keys are in `hf_dict`."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    rope_theta: float = 500_000.0
    rope_scaling: RopeScaling | None = None
    max_positions: int = 131_072
    rms_eps: float = 1e-5
    tied: bool = False
    head_dim_override: int = 0  # config.json's explicit head_dim; 0: hidden // heads

    @property
    def head_dim(self) -> int:
        """Width of one attention head (config.json's ``head_dim``, else hidden / heads)."""
        return self.head_dim_override or self.hidden // self.heads

    def params(self) -> int:
        """Parameter count by formula: embedding, per layer (attention, SwiGLU, two norms), final norm, head.

        Attention: Q and O are hidden × heads·head_dim, K and V hidden × kv_heads·head_dim (GQA);
        the MLP is three hidden × intermediate matrices (gate, up, down); no biases. A tied head
        shares the embedding's matrix, so it adds nothing.
        """
        h, d = self.hidden, self.head_dim
        attn = 2 * h * self.heads * d + 2 * h * self.kv_heads * d
        layer = attn + 3 * h * self.intermediate + 2 * h
        head = 0 if self.tied else self.vocab * h
        return self.vocab * h + self.layers * layer + h + head

    def kv_bytes_per_token(self, itemsize: float) -> float:
        """Bytes one token adds to the KV cache: K and V, every layer, every KV head."""
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize

    def hf_dict(self) -> dict:
        """This shape as a Hugging Face ``config.json`` (``LlamaConfig(**d)`` builds the reference)."""
        rope: dict = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            s = self.rope_scaling
            rope.update(
                rope_type="llama3",
                factor=s.factor,
                low_freq_factor=s.low_freq_factor,
                high_freq_factor=s.high_freq_factor,
                original_max_position_embeddings=s.original_max_position,
            )
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "max_position_embeddings": self.max_positions,
            "rms_norm_eps": self.rms_eps,
            "tie_word_embeddings": self.tied,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        }

    def describe(self) -> str:
        """One line for `deepgap list models`: the dims and the parameter count."""
        return (
            f"Llama decoder ({self.layers} × {self.hidden}, {self.heads} heads / {self.kv_heads} KV, "
            f"ff {self.intermediate}, vocab {self.vocab}{', tied' if self.tied else ''}), "
            f"{_count(self.params())} parameters"
        )


def _count(n: int) -> str:
    """A parameter count with its unit: 8.03B, 1.24B, 4.21M (llama-tiny printed as "0.00B"), or the number."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _llama3_rope(factor: float, original_max_position: int = 8192) -> RopeScaling:
    """Llama-3's RoPE scaling (its low and high frequency factors) at ``factor``."""
    return RopeScaling(
        factor, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=original_max_position
    )


# Published config.json values (meta-llama/Llama-3.2-1B and meta-llama/Llama-3.1-8B on the HF hub), as
# LlamaShape(layers, hidden, intermediate, heads, kv_heads, vocab, ...).
SHAPES: dict[str, LlamaShape] = {
    "llama-3.2-1b": LlamaShape(16, 2048, 8192, 32, 8, 128_256, rope_scaling=_llama3_rope(32.0), tied=True),
    "llama-3.1-8b": LlamaShape(32, 4096, 14_336, 32, 8, 128_256, rope_scaling=_llama3_rope(8.0)),
    # CI-sized: milliseconds per token on a CPU, with GQA (2 query heads per KV head) and RoPE scaling.
    "llama-tiny": LlamaShape(2, 64, 128, 4, 2, 256, max_positions=512, rope_scaling=_llama3_rope(8.0, 64)),
}


def is_config_path(source: str) -> bool:
    """Whether ``source`` names a local HF config rather than a shape: a path, a ``.json`` file, a folder."""
    return source not in SHAPES and (os.sep in source or source.endswith(".json") or os.path.isdir(source))


def shape_of(source: str) -> LlamaShape:
    """A named shape, or the shape in a local HF ``config.json`` (a file or the folder holding it)."""
    if source in SHAPES:
        return SHAPES[source]
    if not is_config_path(source):
        raise UsageError(
            f"unknown Llama shape {source!r}",
            f"choose one of: {', '.join(SHAPES)}, or pass a path to a local config.json",
        )
    from deepgap.store.paths import check_input_path  # never a FIFO, device or /proc file

    check_input_path(source, "config file", "pass a local HF config.json or the folder holding it")
    path = os.path.join(source, "config.json") if os.path.isdir(source) else source
    if not os.path.isfile(path):
        raise UsageError(f"config file {path!r} does not exist", "pass a local HF config.json or its folder")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"config file {path!r} is not valid JSON ({type(exc).__name__})",
            "pass the config.json a Llama checkpoint ships with",
        ) from None
    return parse_hf_config(raw, path)


def parse_hf_config(raw: object, where: str = "config.json") -> LlamaShape:
    """`LlamaShape` from a parsed HF config dict; every missing or wrong key is one `UsageError`."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where} holds a {type(raw).__name__}, not an object", "pass a Llama config.json")
    kind = raw.get("model_type", "llama")
    if kind != "llama":
        raise UsageError(f"{where} is a {kind!r} model, not 'llama'", "pass a Llama-architecture config.json")
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            raise UsageError(f"{where} sets {key}, which this decoder does not build", f"set {key} to false")

    def need(key: str, default: object = None, kind: type = int) -> object:
        value = raw.get(key, default)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        if value is None or not ok or (kind is int and value != int(value)):
            got = "missing" if value is None else f"{value!r}"
            raise UsageError(f"{where}: {key} is {got}", f"give {key} as a positive {kind.__name__}")
        return kind(value)

    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    head_dim = need("head_dim", hidden // heads)
    shape = LlamaShape(
        layers=need("num_hidden_layers"),
        hidden=hidden,
        intermediate=need("intermediate_size"),
        heads=heads,
        kv_heads=need("num_key_value_heads", heads),
        vocab=need("vocab_size"),
        rope_theta=need("rope_theta", _rope_dict(raw).get("rope_theta", 10_000.0), float),
        rope_scaling=_rope_scaling(raw, where),
        max_positions=need("max_position_embeddings", 2048),
        rms_eps=need("rms_norm_eps", 1e-6, float),
        tied=bool(raw.get("tie_word_embeddings", False)),
        head_dim_override=0 if head_dim == hidden // heads else head_dim,  # one spelling per shape
    )
    if heads % shape.kv_heads:
        raise UsageError(
            f"{where}: {heads} attention heads are not a multiple of {shape.kv_heads} KV heads",
            "give num_key_value_heads dividing num_attention_heads",
        )
    return shape


def _rope_dict(raw: dict) -> dict:
    """Transformers ≥ 5 writes ``rope_parameters``; earlier versions (and Meta's files) ``rope_scaling``."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    return rope if isinstance(rope, dict) else {}


def _rope_scaling(raw: dict, where: str) -> RopeScaling | None:
    rope = _rope_dict(raw)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise UsageError(
            f"{where}: RoPE type {kind!r} is not built here",
            "use a config with rope_type 'llama3' or 'default'",
        )
    try:
        return RopeScaling(
            factor=float(rope["factor"]),
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position=int(rope["original_max_position_embeddings"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(
            f"{where}: llama3 RoPE scaling lacks or misspells {exc}",
            "give factor, low_freq_factor, high_freq_factor and original_max_position_embeddings",
        ) from None


def check_run(shape: LlamaShape, batch: int, total_len: int, itemsize: float = 2) -> None:
    """One line for an input a decoder cannot run: a batch or a length out of range, a cache too large."""
    if not 1 <= batch <= MAX_LLM_BATCH:
        raise UsageError(f"batch {batch} is out of range", f"pass a batch from 1 to {MAX_LLM_BATCH}")
    if not 1 <= total_len <= shape.max_positions:
        raise UsageError(
            f"input + output length {total_len} is outside the model's context of {shape.max_positions}",
            f"keep input + output length from 1 to {shape.max_positions}",
        )
    cache = batch * total_len * shape.kv_bytes_per_token(itemsize)
    if cache > MAX_CACHE_BYTES:
        raise UsageError(
            f"a KV cache of batch {batch} × {total_len} tokens needs {cache / 2**40:.1f} TiB",
            "lower the batch or the lengths",
        )


def inv_frequencies(shape: LlamaShape) -> list[float]:
    """RoPE's inverse frequencies in float64, with Llama-3's rescaling (HF's ``_compute_llama3_parameters``).

    Why here and in float64: they are a property of the shape; the module turns them into an fp32
    tensor once, so a model cast to bf16 still rotates with fp32 angles as HF's does.
    """
    d = shape.head_dim
    inv = [1.0 / shape.rope_theta ** (i / d) for i in range(0, d, 2)]
    s = shape.rope_scaling
    if s is None:
        return inv
    low_wavelen = s.original_max_position / s.low_freq_factor
    high_wavelen = s.original_max_position / s.high_freq_factor
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / s.factor)
        else:
            smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor
            )
            out.append((1 - smooth) * f / s.factor + smooth * f)
    return out


def as_dict(shape: LlamaShape) -> dict:
    """The shape as plain data (a benchmark's JSON output records it)."""
    return asdict(shape)
