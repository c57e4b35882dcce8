"""Hugging Face Llama weights in and out of deepgap's decoder: the name map and local safetensors.

Why a map and not HF's names: the decoder fuses Q, K, V into ``qkv_proj`` and gate and up into
``gate_up_proj`` (one GEMM each per decode step), so loading concatenates HF's matrices in that order
and `to_hf` splits them again; every other tensor keeps its HF name without the ``model.`` prefix.
Weights are read only from local files (``*.safetensors``, sharded or not); a file that does not fit
the shape is one `UsageError` naming the tensor.
"""

from __future__ import annotations

import glob
import os

import torch

from deepgap.core.errors import UsageError
from deepgap.measure.models.llama_config import LlamaShape

_ATTN = ("q_proj", "k_proj", "v_proj")
_MLP = ("gate_proj", "up_proj")


def from_hf(hf: dict[str, torch.Tensor], shape: LlamaShape) -> dict[str, torch.Tensor]:
    """HF ``LlamaForCausalLM`` state dict → the decoder's (fused QKV and gate-up; tied head shared)."""
    state = {}
    try:
        state["embed_tokens.weight"] = hf["model.embed_tokens.weight"]
        state["norm.weight"] = hf["model.norm.weight"]
        state["lm_head.weight"] = hf["model.embed_tokens.weight"] if shape.tied else hf["lm_head.weight"]
        for i in range(shape.layers):
            p = f"model.layers.{i}."
            state[f"layers.{i}.self_attn.qkv_proj.weight"] = torch.cat(
                [hf[f"{p}self_attn.{n}.weight"] for n in _ATTN]
            )
            state[f"layers.{i}.self_attn.o_proj.weight"] = hf[f"{p}self_attn.o_proj.weight"]
            state[f"layers.{i}.gate_up_proj.weight"] = torch.cat([hf[f"{p}mlp.{n}.weight"] for n in _MLP])
            state[f"layers.{i}.down_proj.weight"] = hf[f"{p}mlp.down_proj.weight"]
            for norm in ("input_layernorm", "post_attention_layernorm"):
                state[f"layers.{i}.{norm}.weight"] = hf[f"{p}{norm}.weight"]
    except KeyError as exc:
        raise UsageError(
            f"the weights have no tensor {exc.args[0]!r}",
            "pass the weights of a Llama checkpoint of this shape",
        ) from None
    return state


def to_hf(state: dict[str, torch.Tensor], shape: LlamaShape) -> dict[str, torch.Tensor]:
    """The decoder's state dict in HF's names (what `from_hf` reads back); a tied head is left out."""
    d, nq, nkv = shape.head_dim, shape.heads, shape.kv_heads
    hf = {
        "model.embed_tokens.weight": state["embed_tokens.weight"],
        "model.norm.weight": state["norm.weight"],
    }
    if not shape.tied:
        hf["lm_head.weight"] = state["lm_head.weight"]
    for i in range(shape.layers):
        p, ours = f"model.layers.{i}.", f"layers.{i}."
        q, k, v = state[f"{ours}self_attn.qkv_proj.weight"].split((nq * d, nkv * d, nkv * d))
        for n, t in zip(_ATTN, (q, k, v), strict=True):
            hf[f"{p}self_attn.{n}.weight"] = t
        hf[f"{p}self_attn.o_proj.weight"] = state[f"{ours}self_attn.o_proj.weight"]
        gate, up = state[f"{ours}gate_up_proj.weight"].chunk(2)
        hf[f"{p}mlp.gate_proj.weight"], hf[f"{p}mlp.up_proj.weight"] = gate, up
        hf[f"{p}mlp.down_proj.weight"] = state[f"{ours}down_proj.weight"]
        for norm in ("input_layernorm", "post_attention_layernorm"):
            hf[f"{p}{norm}.weight"] = state[f"{ours}{norm}.weight"]
    return hf


def read_safetensors(folder: str) -> dict[str, torch.Tensor]:
    """Every tensor in ``folder``'s ``*.safetensors`` files (one file or HF's shards), on the CPU."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise UsageError(
            "reading .safetensors weights needs safetensors", "pip install safetensors"
        ) from None
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise UsageError(
            f"no .safetensors file in {folder!r}", "pass the folder holding the checkpoint's weights"
        )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(f, device="cpu"))
        except Exception as exc:  # safetensors raises its own SafetensorError, OSError or ValueError
            raise UsageError(
                f"weights file {f!r} cannot be read as safetensors ({type(exc).__name__})",
                "pass an intact .safetensors checkpoint",
            ) from None
    return state


def load_hf_weights(model: torch.nn.Module, folder: str) -> None:
    """Load a local HF checkpoint folder into ``model`` (cast to the model's dtype), or say why not."""
    state = from_hf(read_safetensors(folder), model.shape)
    ours = model.state_dict()
    for name, t in state.items():
        if tuple(t.shape) != tuple(ours[name].shape):
            raise UsageError(
                f"weights in {folder!r}: {name} is {tuple(t.shape)}, the shape needs {tuple(ours[name].shape)}",
                "pass the config.json that belongs to these weights",
            )
    model.load_state_dict(state)
