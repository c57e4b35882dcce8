"""Compile every launched deepgap Triton kernel for an H200 (sm_90) here, with no GPU: run it before a device call.

Why: device time is short, and a kernel that the interpreter and this machine's Triton accept can still fail
to compile under the device's Triton (session 24: every decode GPU test failed on one Triton 3.6 error, a
called jit function's default string, that the CPU suite could not see). Compiling needs no GPU: Triton goes
from the kernel's source to a cubin (ptxas ships in its wheel) for a target it is told.

    PYTHONPATH=/tmp/t36/site:src python benchmarks/compile_sm90.py [--only SUBSTRING] [-j N]

How: each case of `sm90_cases.CASES` calls deepgap's own launch code on meta tensors, with a stand-in driver
that says "sm_90" (Triton's ``driver.set_active``) and Triton's ``jit_cache_hook`` recording what each launch
would compile (the specialization ``JITFunction.preload`` reads: signature, constexprs, alignment, options)
instead of compiling it (`capture`). Each distinct one is then compiled by ``preload``, the device's own path
to the cubin, ptxas's ``-v`` log (``TRITON_DUMP_PTXAS_LOG``) giving registers and spills. One line per compile
(kernel, case, ok or FAIL with the error's last line, registers, spill bytes stored/loaded, shared memory), a
summary, exit 1 if anything failed or a launched kernel (`launched_kernels`, a scan of src/) has no case.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import io
import multiprocessing
import os
import pathlib
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "deepgap"
TARGET = GPUTarget("cuda", 90, 32)


class Sm90Driver:
    """The driver Triton asks for the device, stream and target: device 0 of an sm_90 GPU (nothing is launched)."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return TARGET


@contextlib.contextmanager
def sm90_driver():
    """Inside: Triton sees an sm_90 device (`Sm90Driver`); the driver it had is put back after."""
    before = getattr(driver, "_active", None)
    driver.set_active(Sm90Driver())
    try:
        yield
    finally:
        driver._active = before  # noqa: SLF001 - set_active takes no None, reset_active needs a GPU


@dataclasses.dataclass
class Launch:
    """One launch a case made: its kernel (``module:qualname``) and what it would compile, or why it failed."""

    family: str
    case: str
    kernel: str = ""
    spec: str = ""  # `JITFunction.preload`'s JSON
    error: str = ""


@contextlib.contextmanager
def recording(out: list[tuple[str, str]]):
    """Inside: a kernel launch appends (kernel, specialization) to ``out`` and compiles nothing."""

    def hook(*, fn, compile, **_):
        out.append((f"{fn.module}:{fn.name}", compile["specialization_data"]))
        return True  # skip the compile (and the launch: ``run`` returns None)

    before = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        with sm90_driver():
            yield
    finally:
        knobs.runtime.jit_cache_hook = before


def capture() -> list[Launch]:
    """Every case's launches (`sm90_cases.CASES`), in order; a case whose launch code raises is one error row."""
    import sm90_cases

    launches: list[Launch] = []
    for family, cases in sm90_cases.CASES.items():
        for label, run in cases():
            made: list[tuple[str, str]] = []
            try:
                with recording(made):
                    run()
            except Exception as e:  # noqa: BLE001 - reported as the case's failure
                launches.append(Launch(family, label, error=last_line(e)))
                continue
            launches += [Launch(family, label, kernel, spec) for kernel, spec in made]
            if not made:
                launches.append(Launch(family, label, error="no kernel launched"))
    return launches


def last_line(e: BaseException) -> str:
    """The error's last non-empty line, its type named (Triton's compile errors end with the cause)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:200]


def launched_kernels(root: pathlib.Path = SRC) -> set[str]:
    """``module:name`` of every ``@triton.jit`` function that code outside jit functions names (a launch site).

    Why by name: a kernel is launched as ``launcher(kernel, ...)`` or handed to one (``launch_row(kernel, ...)``);
    a helper is only called from inside jit functions, and compiles through the kernels that call it.
    """
    trees = {"deepgap." + ".".join(p.relative_to(root).with_suffix("").parts): ast.parse(p.read_text())
             for p in sorted(root.rglob("*.py"))}  # fmt: skip
    jit = {
        f"{module}:{node.name}": node
        for module, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any("triton.jit" in ast.unparse(d) for d in node.decorator_list)
    }
    launched = set()
    for module, tree in trees.items():
        inside = {id(n) for key, f in jit.items() if key.startswith(module + ":") for n in ast.walk(f)}
        scope = {key.split(":")[1]: key for key in jit if key.startswith(module + ":")}
        for imp in (n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module):
            scope |= {
                a.asname or a.name: f"{imp.module}:{a.name}"
                for a in imp.names
                if f"{imp.module}:{a.name}" in jit
            }
        for n in ast.walk(tree):
            if (
                isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load)
                and n.id in scope
                and id(n) not in inside
            ):
                launched.add(scope[n.id])
    return launched


@dataclasses.dataclass
class Compiled:
    """A compile's outcome: ok or the error's last line; ptxas's registers and spill bytes; shared memory."""

    error: str = ""
    registers: int = -1
    spill_stores: int = -1
    spill_loads: int = -1
    shared: int = -1
    seconds: float = 0.0


def compile_one(kernel: str, spec: str) -> Compiled:
    """``kernel`` compiled for sm_90 from its captured specialization (``JITFunction.preload``), ptxas -v read."""
    module, name = kernel.split(":")
    t0 = time.perf_counter()
    log = io.StringIO()
    knobs.compilation.always_compile = True  # ptxas runs (and logs) even for a cubin cached before
    knobs.nvidia.dump_ptxas_log = True
    try:
        with sm90_driver(), contextlib.redirect_stdout(log):
            compiled = getattr(importlib.import_module(module), name).preload(spec)
    except Exception as e:  # noqa: BLE001 - reported as this compile's failure
        return Compiled(error=last_line(e), seconds=time.perf_counter() - t0)

    def number(pattern: str) -> int:
        found = re.search(pattern, log.getvalue())
        return int(found.group(1)) if found else -1

    return Compiled(
        registers=number(r"Used (\d+) registers"),
        spill_stores=number(r"(\d+) bytes spill stores"),
        spill_loads=number(r"(\d+) bytes spill loads"),
        shared=compiled.metadata.shared,
        seconds=time.perf_counter() - t0,
    )


def row(launch: Launch, c: Compiled, also: int) -> str:
    """One line: verdict, kernel, case, then ptxas's numbers or the error."""
    kernel = launch.kernel.split(":")[-1] or "-"
    case = f"{launch.family}: {launch.case}" + (f" (+{also} cases)" if also else "")
    if c.error:
        return f"FAIL {kernel:29} {case:66} {c.error}"
    spill = f"spill {c.spill_stores}/{c.spill_loads}" + (" !" if c.spill_stores > 0 else "")
    return f"ok   {kernel:29} {case:66} regs {c.registers:>3} {spill:13} smem {c.shared:>6} {c.seconds:5.1f}s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--only", default="", help="compile only kernels whose name contains this (failed cases show)"
    )
    p.add_argument("-j", type=int, default=1, help="compiles at once (processes)")
    args = p.parse_args(argv)
    if args.j < 1:
        print(f"compile_sm90: -j {args.j}: give 1 or more processes", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    os.environ.setdefault(
        "TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="compile_sm90-")
    )  # this run's cubins only
    print(f"Triton {triton.__version__} ({pathlib.Path(triton.__file__).parent}), target sm_90", flush=True)
    launches = capture()
    missing = sorted(launched_kernels() - {ln.kernel for ln in launches})
    # a case whose launch code raised names no kernel: it is shown whatever --only says (session 41's spread
    # tiles refused their meta operands, and `--only conv_gemm` hid it)
    launches = [ln for ln in launches if args.only in ln.kernel.split(":")[-1] or ln.error]
    if not launches:
        print(
            f"compile_sm90: --only {args.only!r} matches no kernel; give part of a kernel's name",
            file=sys.stderr,
        )
        return 2
    first: dict[tuple[str, str], Launch] = {}
    also: dict[tuple[str, str], int] = {}
    for ln in launches:
        key = (ln.kernel, ln.spec or ln.case)
        first.setdefault(key, ln)
        also[key] = also.get(key, -1) + 1
    jobs = [k for k, ln in first.items() if not ln.error]
    with (
        ProcessPoolExecutor(args.j, multiprocessing.get_context("fork"))
        if args.j > 1
        else contextlib.nullcontext() as pool
    ):
        kernels_, specs = [k for k, _ in jobs], [s for _, s in jobs]
        results = (pool.map if pool else map)(compile_one, kernels_, specs)  # in order, as each finishes
        failed = spilled = 0
        for key, ln in first.items():
            c = Compiled(error=ln.error) if ln.error else next(results)
            failed += bool(c.error)
            spilled += c.spill_stores > 0
            print(row(ln, c, also[key]), flush=True)
    for kernel in missing if not args.only else ():
        print(f"FAIL {kernel.split(':')[-1]:30} no case launches it (benchmarks/sm90_cases.py)")
    kernels = len({ln.kernel for ln in launches if ln.kernel})
    print(
        f"Triton {triton.__version__}: {len(first)} compiles of {kernels} kernels from "
        f"{len({(ln.family, ln.case) for ln in launches})} cases: {len(first) - failed} ok, {failed} failed, "
        f"{spilled} spill; {len(missing) if not args.only else 0} launched kernels without a case; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    return 1 if failed or (missing and not args.only) else 0


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    sys.exit(main())
