"""Request inputs in one ring of uint8 images, so that a batch is one or two contiguous copies.

Why uint8: a decoded image is 3 bytes a pixel; sending it as fp16 doubles the bytes over PCIe and as
fp32 quadruples them. MLPerf's harnesses send uint8/int8 and normalise on the device; so do we.
Why a ring: the batcher dispatches requests in arrival order, so a batch is a contiguous range of
request indices; request ``k`` lives in slot ``k % size`` of one (pinned, on a GPU) buffer, and a
batch is the slice ``[first % size, …)`` — one copy, or two where it wraps past the end. No gather,
no per-request copy. The ring is filled once with seeded images (the payloads a front end would have
written there as requests arrived), NHWC as images come from a decoder.
"""

from __future__ import annotations

from typing import Any

import torch

from deepgap.measure.images import IMAGENET_MEAN, IMAGENET_STD


def spans(first: int, count: int, size: int) -> list[tuple[int, int, int]]:
    """(ring start, batch start, length) of the one or two contiguous pieces of a batch."""
    if not 0 < count <= size:
        raise ValueError(f"a batch of {count} does not fit a ring of {size}")
    s = first % size
    head = min(count, size - s)
    out = [(s, 0, head)]
    if head < count:
        out.append((0, head, count - head))
    return out


class InputRing:
    """``size`` uint8 images (N, H, W, 3), pinned when the device is a GPU."""

    def __init__(self, size: int, resolution: int, seed: int = 0, pin: bool = False) -> None:
        g = torch.Generator().manual_seed(seed + 7)
        self.images = torch.randint(0, 256, (size, resolution, resolution, 3), generator=g, dtype=torch.uint8)
        if pin:
            self.images = self.images.pin_memory()
        self.size = size

    def spans(self, first: int, count: int) -> list[tuple[int, int, int]]:
        """See `spans`."""
        return spans(first, count, self.size)

    def copy_batch(self, dst: Any, first: int, count: int, non_blocking: bool = False) -> int:
        """Copy requests ``first … first+count-1`` into ``dst[:count]``; returns the number of copies."""
        pieces = self.spans(first, count)
        for r, d, n in pieces:
            dst[d : d + n].copy_(self.images[r : r + n], non_blocking=non_blocking)
        return len(pieces)

    def nbytes(self, count: int) -> int:
        """Bytes a batch of ``count`` moves."""
        return count * self.images[0].numel()


class Normaliser:
    """uint8 NHWC → the engine's dtype and layout, ImageNet-normalised, in one elementwise kernel.

    ``backend`` 'triton' is `normalise_kernel` (flat over the storage: 3.2× torch's ``addcmul`` on one H100,
    session 47), 'torch' is ``addcmul``; 'auto' takes Triton on a GPU wherever the tensors fit it, torch
    otherwise (a CPU server keeps torch, and needs no Triton: the kernel's module is imported only to run it).
    """

    def __init__(self, dtype: Any, device: Any, backend: str = "auto") -> None:
        if backend not in ("auto", "triton", "torch"):
            raise ValueError(f"backend must be auto, triton or torch; got {backend!r}")
        std = torch.tensor(IMAGENET_STD, dtype=torch.float32)
        mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32)
        scale, shift = 1.0 / (255.0 * std), -mean / std  # fp32, one value a channel
        self.scale = scale.view(1, 3, 1, 1).to(device)
        self.shift = shift.view(1, 3, 1, 1).to(device)
        self.scales, self.shifts = tuple(scale.tolist()), tuple(shift.tolist())  # the kernel's scalars
        self.dtype = dtype
        self.backend = backend

    def __call__(self, u8: Any, out: Any) -> Any:
        """``out[:n] = (u8 / 255 − mean) / std`` for ``u8`` (n, H, W, 3); fp32 math, stored as ``out``."""
        n = u8.shape[0]
        dst = out[:n]
        if self.backend == "triton" or (self.backend == "auto" and u8.device.type == "cuda"):
            from deepgap.serving.worker import normalise_kernel  # Triton: a GPU's torch brings it

            if self.backend == "triton" or normalise_kernel.fits(u8, dst):
                normalise_kernel.normalise(u8, dst, self.scales, self.shifts)
                return dst
        return torch.addcmul(self.shift, u8.permute(0, 3, 1, 2), self.scale, out=dst)

    def reference(self, u8: Any) -> Any:
        """The same normalisation on the CPU in fp32 (NCHW): the correctness reference's input."""
        return (u8.permute(0, 3, 1, 2).float() * self.scale.cpu() + self.shift.cpu()).contiguous()
