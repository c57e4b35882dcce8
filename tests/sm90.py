"""Ahead-of-time compiles for sm_90 (Hopper), with no GPU: what a test reads from the PTX a kernel becomes."""

from __future__ import annotations

import pytest
import triton


def compile_sm90(kernel, sig: dict, const: dict, aligned: tuple[str, ...] = (), **options):
    """``kernel`` compiled for sm_90: ``sig`` its runtime arguments' types, ``const`` its constexprs.

    ``aligned``: the arguments the JIT would find divisible by 16 (aligned pointers, N % 16 == 0). A Triton
    install without a CUDA toolchain skips the test.
    """
    from triton.backends.compiler import GPUTarget

    sig = {**sig, **{k: "constexpr" for k in const}}
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = triton.compiler.ASTSource(fn=kernel, signature=sig, constexprs=const, attrs=attrs)
    try:
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    except (RuntimeError, FileNotFoundError, OSError) as exc:  # pragma: no cover - toolchain missing
        pytest.skip(f"no CUDA toolchain in this Triton install: {exc}")


def ptxas_spills(compiled) -> int:
    """Bytes of spill stores that ptxas (Triton's own, ``-v``) reports for ``compiled``'s PTX.

    Why again: Triton runs ptxas to build the cubin but keeps its report only where a GPU loads the kernel.
    """
    import re
    import subprocess
    import tempfile

    from triton import knobs

    ptx = compiled.asm["ptx"]
    arch = re.search(r"^\.target (\w+)", ptx, re.M).group(1)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        done = subprocess.run(
            [knobs.nvidia.ptxas.path, f"-arch={arch}", "-v", f.name, "-o", "/dev/null"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    return sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", done.stderr))
