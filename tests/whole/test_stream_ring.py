"""benchmarks/stream_ring.py reads and sums what it says, and its loop stays pipelined through the grid barrier.

Why: the benchmark's question (can one program an SM stream the decode step's weights through ~160 barriers)
is answered only if each tile is really read and used, and if the ``flat`` loop's loads really run ahead of the
barrier: a barrier that stopped Triton's software pipeline (``tl.debug_barrier`` does, compiled for sm_90) would
time the old register-step kernel under a new name.
"""

from __future__ import annotations

import re

import pytest
import torch
from repo_paths import imported_benchmark
from sm90 import compile_sm90

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def ring():
    yield from imported_benchmark("stream_ring")


def expected(s: dict) -> torch.Tensor:
    """Each phase's per-program sums in fp32 torch: phase p + 1 reads the first BK sums phase p stored."""
    programs, _, bn, bk = s["w"].shape
    w = s["w"].float()
    x = s["x"].float()
    out, start = [], 0
    for end in s["ends"].tolist():
        sums = torch.einsum("gink,k->gn", w[:, start:end], x)
        out.append(sums)
        x = torch.cat([sums.flatten(), torch.zeros(bk)])[:bk]
        start = end
    return torch.stack(out)


@pytest.mark.parametrize("stages", [1, 3])
def test_the_barrier_free_walk_sums_every_tile_of_every_phase(ring, stages):
    torch.manual_seed(0)
    # BK = BN: each phase's input is program 0's own sums, which Triton's interpreter (one program at a time,
    # program 0 first) has stored before any other program reads them
    s = ring.setup(3, 16, 16, plan=[("a", 3), ("b", 1), ("c", 2)], device="cpu")
    s["w"].copy_((torch.randn(s["w"].shape) / 4).to(s["w"].dtype))
    ring.launch(s, 0, stages, "none", 4)
    torch.testing.assert_close(s["out"], expected(s), rtol=1e-4, atol=1e-3)


def test_the_8b_plan_reads_the_step_s_bytes(ring):
    plan = ring.phases(16 * 1024, 132)
    assert len(plan) == 32 * 5 + 1
    read = sum(n for _, n in plan) * 16 * 1024 * 132
    attention = 32 * 16 * 1024 * 132  # one tile a program a layer, the attention's stand-in
    weights = 32 * sum(mb for _, mb in ring.LAYER_MB) * 1e6 + ring.HEAD_MB * 1e6
    assert read - attention == pytest.approx(weights, rel=0.002)


SIG = {"w_ptr": "*fp8e4nv", "x_ptr": "*bf16", "out_ptr": "*fp32", "bar_ptr": "*i32", "err_ptr": "*i32",
       "ends_ptr": "*i32", "n_items": "i32", "n_phases": "i32", "epoch": "i32", "G": "i32"}  # fmt: skip


@pytest.mark.parametrize("mode", ["flat", "nested"])
def test_the_loop_with_its_barrier_still_loads_tiles_ahead_on_hopper(ring, mode):
    const = {"BN": 16, "BK": 1024, "STAGES": 4, "MODE": ring.MODES.index(mode), "THREADS": 256}
    ptx = compile_sm90(ring.ring_kernel, SIG, const, aligned=tuple(SIG)[:6], num_warps=8).asm["ptx"]
    assert len(re.findall(r"cp\.async\.c[ga]", ptx)) >= 16  # 16-byte copies into shared memory, stages deep
    assert "red.relaxed.gpu.global.add.s32" in ptx and "bar.sync 0" in ptx  # the barrier is there


# Compiled in a process of its own: once Triton's interpreter has run a kernel in a process (as the tests above do,
# and much of the suite), Gluon's builtins there refuse to compile ("Did you forget to add @triton.gluon.jit ?").
WS_PTX = """
import sys
sys.path.insert(0, "benchmarks")
import compile_sm90, stream_ring as ring, stream_ring_ws as ws
warps = int(sys.argv[1])
s = ring.setup(132, 32, 256, plan=[("a", 3), ("b", 2)], device="meta")
walk = ws.WsRing(s, 4, True, warps, 1)
with compile_sm90.sm90_driver():
    k = ws.ring_ws_kernel.warmup(walk.desc, *ring.args(s, 0)[1:], BN=32, BK=256, STAGES=4, BARRIER=True,
                                 WARPS=warps, REDUCE=1, num_warps=warps, grid=(132,))
print(k.asm["ptx"])
"""


@pytest.mark.parametrize("warps", [4, 8])
def test_the_producer_warp_variant_compiles_to_tma_copies_and_a_barrier_of_its_consumers_alone(warps):
    """Gluon's warp-specialized walk for sm_90: TMA copies into the ring, and the grid barrier's ``bar.sync`` over
    the consumer warps' threads only (``bar.sync 0`` would wait for the producer warp, which never comes)."""
    import subprocess
    import sys

    from repo_paths import ROOT

    done = subprocess.run(
        [sys.executable, "-c", WS_PTX, str(warps)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ptx = done.stdout
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::\w+\.global\.mbarrier", ptx)  # ::cluster in 3.6
    assert "bar.sync 15, %r" in ptx and "red.relaxed.gpu.global.add.s32" in ptx
    assert not re.search(r"bar\.sync\s+0;", ptx)  # no barrier over the whole block
