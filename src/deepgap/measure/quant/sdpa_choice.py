"""Which SDPA kernel the quant engine's attention runs, and what the row says ran.

Why: the quant engine runs attention through ``F.scaled_dot_product_attention`` in bf16, and which kernel
that is depends on torch's version and the GPU (torch 2.14 lists FlashAttention-2 first). On one H200 (session
25, results/h200/session25): cuDNN's backend alone took 0.63–0.70× FlashAttention-2's time at every encoder
shape deepgap measures (`benchmarks/sdpa_backends.py`: bert-base at 128 and 384, bert-large at 384,
ViT-B/16; 239–388 against 151–256 TFLOPS), and torch 2.11's own order already dispatched the engine's
attention to cuDNN there (``engine_info.attention.ran`` and the profile said so). Forcing cuDNN first
measured what torch's order did, within run-to-run spread (bert-base 32,203 against 32,521–33,157 seq/s in
`deepgap run`; the bare loop's bert-large at 384 3,324 against 3,306–3,437). So the default keeps torch's
order, ``cudnn`` puts cuDNN first where a torch would not, and ``flash``/``efficient`` force one to compare.

The order is set while Inductor traces the forward and the graph is captured, so the replays run what was
chosen then. Two guards keep the label true:

- the compile caches are keyed by the mode (``torch.compiler.config.cache_key_tag``): without it a graph
  compiled under one backend order came back from the cache under another (the GPU test caught a cuDNN
  graph served to a FlashAttention-only compile);
- `chosen` asks torch which kernel each attention call of one eager forward gets under the mode
  (``torch._fused_sdp_choice``, SDPA's own dispatch), so ``engine_info.attention.ran`` names it, also where
  cuDNN cannot take a call and torch falls back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.nn import functional as F  # noqa: N812 - torch's own spelling
from torch.overrides import TorchFunctionMode

from deepgap.core import switches

ENV = "DEEPGAP_QUANT_SDPA"
# "torch": torch's own order; "cudnn": cuDNN first, then torch's order; "flash"/"efficient": that one only
MODES = switches.choices(ENV)
DEFAULT = switches.SWITCHES[ENV].default  # "torch"
LABELS = {
    "CUDNN_ATTENTION": "cuDNN",
    "FLASH_ATTENTION": "FlashAttention-2",
    "EFFICIENT_ATTENTION": "memory-efficient",
    "MATH": "math (unfused)",
    "OVERRIDEABLE": "overrideable",
}


def mode(value: str | None = None) -> str:
    """``value`` checked, else ``DEEPGAP_QUANT_SDPA`` (unset: `DEFAULT`); a bad switch stops the prepare."""
    return switches.given(ENV, value) or switches.read(ENV)


@contextlib.contextmanager
def backends(name: str) -> Iterator[None]:
    """SDPA's backends as mode ``name`` orders them, and the compile caches keyed by it, inside the block."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = {
        "cudnn": [
            SDPBackend.CUDNN_ATTENTION,
            SDPBackend.FLASH_ATTENTION,
            SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.MATH,
        ],  # fmt: skip
        "flash": [SDPBackend.FLASH_ATTENTION],
        "efficient": [SDPBackend.EFFICIENT_ATTENTION],
    }.get(name)
    with contextlib.ExitStack() as stack:
        config = getattr(torch.compiler, "config", None)
        if hasattr(config, "cache_key_tag"):
            stack.enter_context(config.patch(cache_key_tag=f"deepgap-sdpa={name}"))
        if order is not None:
            stack.enter_context(sdpa_kernel(order, set_priority=len(order) > 1))
        yield


class _Dispatch(TorchFunctionMode):
    """Records SDPA's own choice of kernel for each attention call it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            from torch.nn.attention import SDPBackend

            name = SDPBackend(torch._fused_sdp_choice(*args, **kwargs)).name
            label = LABELS.get(name, name)
            if label not in self.seen:
                self.seen.append(label)
        return func(*args, **kwargs)


def chosen(net: torch.nn.Module, x: torch.Tensor, name: str) -> list[str]:
    """The kernels SDPA gives the attention calls of one eager forward of ``net`` on ``x`` under mode ``name``."""
    probe = _Dispatch()
    with backends(name), torch.inference_mode(), probe:
        net(x)
    packed = getattr(getattr(net, "packed", None), "ran", None)  # a packed text batch's own attention
    return probe.seen + ([packed] if packed and packed not in probe.seen else [])
