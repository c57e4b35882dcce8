"""Split-K for the quant engine's convolutions at small batches: the K loop of a tile spread over programs.

Why: at batch 1 ResNet-50 is latency-bound, and the per-layer table (session 26, one H200, fp8) names its
late 3×3 layers: layer4's `conv2` (M = 49 rows, N = 512, K = 4,608) takes 13.5 µs as 8 programs of
64×64, each walking 36 K steps alone while 124 SMs idle, and layer3's (M = 196, N = 256, K = 2,304) 8.3 µs
as 16 programs. The three layer4 and six layer3 `conv2` are about 90 µs of the network's 294. With
``SPLIT`` programs per tile (`kernels.conv_gemm_kernel`'s second grid axis) each sums one K slice into a
partial tile in a scratch buffer (fp32, or int32 for int8: exact), takes a ticket from the tile's counter,
and the program that takes the last ticket adds the partials in slice order (so the result does not
depend on which program came last), resets the counter, and runs the epilogue. One launch, no second
kernel: a separate reduction kernel would cost a launch of its own at this batch.

On by default (`tiles.small_batch_offered`; ``DEEPGAP_QUANT_SMALL_BATCH=off`` leaves it out): the tuner
times `split_configs`' tiles beside the others for layers that leave most SMs idle, and keeps the fastest
that passes its self-check (int8 exactly; fp8 sums in another order, within the fp8 bound). Session 27
(one H200, batch 1) kept it for layer3's six `conv2` (split 3: 8.1 → 7.1 µs) and layer4's three (split 6:
13.3 → 7.8 µs); ResNet-50 fp8 at batch 1 went from 0.277 to 0.270 ms in `deepgap run`.
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from deepgap.measure.quant import whole_flow
from deepgap.measure.quant.launch import INT32_LIMIT, check
from deepgap.measure.quant.tiles import small_batch_mode

MAX_SPLIT = 16  # programs per tile at most


def split_configs(
    base: list, m: int, n: int, k_total: int, sms: int, limit: int = 2, spread: bool = False
) -> list:
    """Split-K variants of the 64-row tiles in ``base`` for a layer whose tiles leave most SMs idle.

    Each 64-row tile at most 64 columns wide (the first ``limit``) gets up to three splits, each ≤ `MAX_SPLIT`,
    keeping tiles × split within the SMs and cutting its K steps into equal slices of at least 2 steps: the largest,
    and the largest at most a half and a quarter of it. Why several: the first GPU timing (session 27, one
    H200, batch 1) found layer4's `conv2` at 11.1 µs with split 12 against 13.3 µs unsplit, far from the
    slices' own time, so the reduction's share (one program adds every partial) is weighed by the tuner
    against the slices'. None where the tiles already fill half the SMs, and none of the early-residual or
    persistent tiles. With ``spread`` (a GPU: the slices wait for each other, which Triton's interpreter,
    running one program at a time, cannot) each split comes twice, the second summing as `spread_sum` does
    (not with ``DEEPGAP_QUANT_SMALL_BATCH=split``).
    Why no wider tile: in session 27's main job every split kept (ResNet-18/50/101, int8
    and fp8, 168 layer builds) was 64×64 with split 3 or 6; a 64×128 split tile never won, and in int8 its
    unrolled reduction spills, so it only cost compile and tuning time.
    """
    out = []
    eligible = [
        c for c in base if c.bm == 64 and c.bn <= 64 and not (c.persistent or c.split_k > 1 or c.early_res)
    ]
    for cfg in eligible[:limit]:
        tiles = -(-m // cfg.bm) * (n // cfg.bn)
        steps = k_total // cfg.bk
        if 2 * tiles > sms:
            continue
        fit = [s for s in range(MAX_SPLIT, 1, -1) if tiles * s <= sms and steps % s == 0 and steps // s >= 2]
        picked = fit[:1] + [next((s for s in fit if s <= fit[0] // d), None) for d in (2, 4)] if fit else []
        for s in dict.fromkeys(s for s in picked if s is not None):
            out.append(dataclasses.replace(cfg, split_k=s))
            if spread and small_batch_mode() == "on":
                out.append(dataclasses.replace(cfg, split_k=s, spread=True))
    return out


def scratch(w: torch.Tensor, m: int, n: int, split: int, tiles: int, acc_int: bool):
    """(partials [split·m·n], counters [2·tiles + 1]) for the layer whose weights are ``w``: made once, reused.

    Why kept on the weight tensor: a CUDA graph bakes these addresses in and owns the network, so they live
    exactly as long as the layer; the counters must start at zero, which the last program of each tile
    restores; two networks never share them. Made outside a graph capture (the tuner's eager calls come
    first); asked for first inside one, it refuses rather than capture an allocation whose zeros would not
    be there at replay.
    """
    kept = w.__dict__.setdefault("_deepgap_split_k", {})
    # tiles in the key: a 64×128 and a 64×64 tile of one split share the partials' size but not the tile
    # count, and counters sized for the fewer tiles sent the others' tickets past the end (session 27's
    # GPU test: those tiles were never written)
    key = (m, n, split, acc_int, tiles)
    if key not in kept:
        check(split * m * n <= INT32_LIMIT, "split-K partials past 2^31 elements; use fewer splits")
        check(
            not (w.is_cuda and torch.cuda.is_current_stream_capturing()),
            "split-K scratch must be made before a CUDA graph captures the layer (run it once eagerly)",
        )
        dtype = torch.int32 if acc_int else torch.float32
        kept[key] = (
            torch.empty(split * m * n, dtype=dtype, device=w.device),
            torch.zeros(2 * tiles + 1, dtype=torch.int32, device=w.device),  # `spread_sum` uses them all
        )
    return kept[key]


def operands(
    cfg, w: torch.Tensor, m: int, n: int, k_total: int, tiles: int, acc_int: bool, out: torch.Tensor
):
    """(split, partials, counters) for a `kernels.conv_gemm` launch of tile ``cfg``.

    Without split-K (split 1) the two buffers are ``out``, never read.
    """
    split = int(getattr(cfg, "split_k", 1) or 1)
    if split == 1:
        return 1, out, out
    check(not cfg.early_res, "split-K tiles take no early residual")
    check(
        k_total % (split * cfg.bk) == 0,
        f"split-K {split} needs K = {k_total} in whole slices of BK = {cfg.bk}",
    )
    return (split, *scratch(w, m, n, split, tiles, acc_int))


@triton.jit
def split_sum(acc, ws_ptr, cnt_ptr, offs, m_ok, M, N, SPLIT: tl.constexpr):
    """(the tile's whole sum, whether this program has it): split-K's reduction, in one launch.

    Each program stores its slice's partial tile, then takes a ticket (an acquire-release atomic, after a
    barrier so the whole tile's stores come before it); the one with the last ticket reads every partial
    from L2 (``.cg``: another SM's stores are not in this SM's L1) in slice order, so the sum does not
    depend on the order the programs finished, and puts the counter back to zero for the next call.
    """
    tile = tl.program_id(0)
    tl.store(ws_ptr + tl.program_id(1) * M * N + offs, acc, mask=m_ok[:, None])
    tl.debug_barrier()
    last = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu") == SPLIT - 1
    total = tl.zeros_like(acc)
    if last:
        for s in tl.static_range(SPLIT):  # unrolled: every slice's load in flight at once
            total += tl.load(ws_ptr + s * M * N + offs, mask=m_ok[:, None], other=0, cache_modifier=".cg")
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")
    return total, last


def faults(weights) -> str | None:
    """After runs: what a spread tile's flag says (`spread_sum`: a wait that gave up), for the layers of ``weights``.

    Why asked: a wait that gives up lets its band be summed without every slice, and the output shows nothing;
    the flag (``cnt[2·tiles]``) stays set, so the engine's `Prepared.faults` turns the configuration into an
    error instead of a stored number.
    """
    for w in weights:
        for (m, n, split, _, tiles), (_, cnt) in w.__dict__.get("_deepgap_split_k", {}).items():
            if cnt[2 * tiles].item():
                return f"a split-K wait gave up ({m}×{n} output, split {split}): the outputs are not to be trusted"
    return None


def constexprs(cfg, device) -> dict:
    """`kernels.conv_gemm_kernel`'s ``SPREAD`` and ``PARTS`` for tile ``cfg`` (`spread_sum`): on a GPU only."""
    spread = bool(getattr(cfg, "spread", False)) and cfg.split_k > 1
    check(not spread or device.type != "cpu", "a spread split-K tile runs on a GPU only (its slices wait)")
    parts = 1 << (cfg.split_k.bit_length() - 1)  # the largest power of 2 ≤ split: the programs that sum
    return {"SPREAD": spread, "PARTS": min(parts, cfg.bm) if spread else 1}


@triton.jit
def spread_sum(acc, ws_ptr, cnt_ptr, offs, m_ok, M, N, row0, rn, SPLIT: tl.constexpr, PARTS: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr):  # fmt: skip
    """(a band's whole sum, its offsets, its row mask, whether this program has a band): `split_sum`, shared.

    Why: `split_sum`'s last program reads every partial tile alone, one L2 round trip after another, and at
    batch 1 that reduction cost more than a finer split saved (session 27: layer4's conv2 11.1 µs at split 12,
    7.8 at 6). Here each program stores its partial and arrives at the tile's counter (`whole_flow`'s
    one-thread arrive: fence, add); the first ``PARTS`` programs then wait for all ``SPLIT`` and each sums
    its own band of BM / PARTS rows over the partials, in slice order (the same sum, bit for bit, as
    `split_sum`'s), and runs the epilogue on it. The tile's slices are co-resident: the grid fits the SMs
    (`split_configs`), and under PDL the next kernel starts only once all of this one's programs have. The
    last to leave zeroes the tile's two counters; a wait past `whole_flow.LIMIT` polls sets the flag at
    ``cnt_ptr[2·tiles]``, which `faults` reads after the runs.
    """
    tile = tl.program_id(0)
    s = tl.program_id(1)
    tiles = tl.num_programs(0)
    tl.store(ws_ptr + s * M * N + offs, acc, mask=m_ok[:, None])
    whole_flow.grid_arrive(cnt_ptr + tile, 1)
    rows = row0 + s * (BM // PARTS) + tl.arange(0, BM // PARTS)
    mine = rows < M
    band = rows[:, None] * N + rn[None, :]
    total = tl.zeros((BM // PARTS, BN), dtype=acc.dtype)
    if s < PARTS:
        whole_flow.grid_wait(cnt_ptr + tile, cnt_ptr + 2 * tiles, SPLIT, 1, True)
        for i in tl.static_range(SPLIT):  # every slice's band in flight at once
            total += tl.load(ws_ptr + i * M * N + band, mask=mine[:, None], other=0, cache_modifier=".cg")
        if tl.atomic_add(cnt_ptr + tiles + tile, 1, sem="acq_rel", scope="gpu") == PARTS - 1:
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(cnt_ptr + tiles + tile, 0, sem="relaxed", scope="gpu")
    return total, band, mine, s < PARTS
