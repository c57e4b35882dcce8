"""Ahead-of-time compiles for sm_90 (Hopper), with no GPU: what a test reads from the PTX a kernel becomes."""

from __future__ import annotations

import pytest
import triton


def compile_sm90(kernel, sig: dict, const: dict, aligned: tuple[str, ...] = (), **options):
    """``kernel`` compiled for sm_90: ``sig`` its runtime arguments' types, ``const`` its constexprs.

    ``aligned``: the arguments the JIT would find divisible by 16 (aligned pointers, N % 16 == 0). An argument
    in neither that has a default takes it as a constexpr (a pointer left None: a path not taken). A Triton
    install without a CUDA toolchain skips the test.
    """
    from inspect import Parameter

    from triton.backends.compiler import GPUTarget

    unset = (p for p in kernel.params if p.name not in sig and p.name not in const)
    const = {**{p.name: p.default for p in unset if p.default is not Parameter.empty}, **const}
    sig = {**sig, **{k: "constexpr" for k in const}}
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = triton.compiler.ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=attrs)
    try:
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    except (RuntimeError, FileNotFoundError, OSError) as exc:  # pragma: no cover - toolchain missing
        pytest.skip(f"no CUDA toolchain in this Triton install: {exc}")


def ptxas_usage(compiled) -> dict[str, int]:
    """Registers and spill bytes per thread of an `compile_sm90` result: ``ptxas -v`` on its PTX, for sm_90a.

    Why: without a GPU the compiled kernel has no ``n_spills``/``n_regs`` (they are read when it loads);
    ptxas says the same at compile time. Keys: ``registers``, ``spill_stores``, ``spill_loads``.
    """
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as d:
        ptx = Path(d) / "k.ptx"
        ptx.write_text(compiled.asm["ptx"])
        cmd = [get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(ptx), "-o", str(Path(d) / "k.o")]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr

    def count(pattern: str) -> int:
        found = re.search(pattern, log)
        assert found, f"ptxas -v said no {pattern!r}: {log}"
        return int(found.group(1))

    return {
        "registers": count(r"Used (\d+) registers"),
        "spill_stores": count(r"(\d+) bytes spill stores"),
        "spill_loads": count(r"(\d+) bytes spill loads"),
    }


def ptxas_spills(compiled) -> int:
    """Bytes of spill stores per thread that ptxas reports for ``compiled``'s PTX (`ptxas_usage`)."""
    return ptxas_usage(compiled)["spill_stores"]


def assert_swapped_stem(compiled, block: int, warps: int, per_sm: int) -> str:
    """The swapped stem kernels' sm_90 code (`stem_s2d.swap_dot`), returned as PTX for more checks.

    The 64 channels are the wgmma's M and the tile's ``block`` pixels its N, each warpgroup its share, at most 128
    an instruction; the pixels' gathers are 16-byte ``cp.async``; nothing spills; ``per_sm`` programs' shared
    memory fits one SM (228 KB).
    """
    import re

    ptx = compiled.asm["ptx"]
    wide = min(block // (warps // 4), 128)
    assert f"wgmma.mma_async.sync.aligned.m64n{wide}k32.s32.s8.s8" in ptx
    gathers = set(re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], (0x[0-9a-f]+)", ptx))
    assert gathers == {"0x10"}
    assert ptxas_usage(compiled)["spill_stores"] == 0
    assert compiled.metadata.shared * per_sm <= 228 * 1024
    return ptx
