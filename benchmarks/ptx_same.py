"""Whether a change leaves deepgap's kernels as they were: every sm_90 case's PTX here against a base revision's.

Why: a refactor of kernel code (a parameter dropped, a helper moved or shared, a dead branch removed) should
change no instruction of the kernels the engine keeps, and a session without a GPU cannot time an A/B. Here
every case of `sm90_cases.CASES` is compiled for sm_90 (as `compile_sm90.py` does, no GPU) in this tree and in
a ``git worktree`` of ``BASE``, and the PTX is compared after `normalize` drops what moves with the source but
runs nothing: line and file records, debug sections, comments, and the numbers of the kernel's parameters
(a parameter removed renumbers the ones after it). Session 42 checked its removals and the fp8 KV cache so:
85 launches whose signatures changed, the other 312 byte-identical, all equal after normalizing.

    PYTHONPATH=/tmp/t36/site:src python benchmarks/ptx_same.py BASE [--only SUBSTRING] [-j N]

One line per changed case, then counts: same, changed, only in BASE (cases removed), only here (added).
Exit 1 where a case of both trees compiles to other instructions, 0 where none does.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parent.parent


def normalize(ptx: str) -> str:
    """The PTX's instructions: no ``.loc``/``.file`` records, debug sections, comments, blank lines or
    parameter declarations, and every ``<kernel>_param_<i>`` as ``<kernel>_param_N``."""
    out, debug = [], False
    for line in ptx.splitlines():
        s = line.strip()
        debug = debug or (s.startswith(".section") and "debug" in s)
        if debug or not s or s.startswith((".loc", ".file", "//", ".param")):
            continue
        out.append(re.sub(r"_param_\d+", "_param_N", s))
    return "\n".join(out)


def _ptx(job: tuple[str, str]) -> str:
    """One launch's normalized PTX for sm_90 (``kernel``: ``module:name``; its captured specialization)."""
    import compile_sm90

    kernel, spec = job
    module, name = kernel.split(":")
    try:
        with compile_sm90.sm90_driver():
            compiled = getattr(importlib.import_module(module), name).preload(spec)
    except Exception as e:  # noqa: BLE001 - a compile that fails is a difference like any other
        return "FAILED " + compile_sm90.last_line(e)
    return normalize(compiled.asm["ptx"])


def dump(tree: pathlib.Path, only: str, jobs: int) -> dict[str, str]:
    """``case | kernel`` → the hash of its normalized PTX, for the tree whose src/ and benchmarks/ lead sys.path."""
    sys.path[:0] = [str(tree / "benchmarks"), str(tree / "src")]
    import compile_sm90

    launches = [ln for ln in compile_sm90.capture() if not ln.error and only in ln.kernel.split(":")[-1]]
    keys = sorted({(ln.kernel, ln.spec) for ln in launches})
    with ProcessPoolExecutor(jobs) as pool:
        texts = dict(zip(keys, pool.map(_ptx, keys), strict=True))
    return {
        f"{ln.family}: {ln.case} | {ln.kernel.split(':')[-1]}": hashlib.sha1(
            texts[(ln.kernel, ln.spec)].encode()
        ).hexdigest()[:16]
        for ln in launches
    }


def compare(base: dict[str, str], here: dict[str, str]) -> tuple[list[str], list[str], list[str], int]:
    """(changed, only in base, only here, same) over two dumps' cases."""
    changed = sorted(k for k in here.keys() & base.keys() if here[k] != base[k])
    same = len(here.keys() & base.keys()) - len(changed)
    return changed, sorted(base.keys() - here.keys()), sorted(here.keys() - base.keys()), same


def _dump_in(tree: pathlib.Path, only: str, jobs: int, out: pathlib.Path) -> None:
    """`dump` of ``tree`` in a process of its own (its modules, not this tree's), into ``out`` as JSON."""
    env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="ptx_same-")}
    subprocess.run(
        [sys.executable, __file__, "--dump", str(out), "--tree", str(tree), "--only", only, "-j", str(jobs)],
        check=True,
        cwd=tree,
        env=env,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", nargs="?", help="the revision to compare with (a commit, branch or tag)")
    p.add_argument("--only", default="", help="only kernels whose name contains this")
    p.add_argument("-j", type=int, default=2, help="compiles at once (processes)")
    p.add_argument("--dump", help=argparse.SUPPRESS)  # internal: write one tree's dump here
    p.add_argument("--tree", default=str(ROOT), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.dump:
        pathlib.Path(args.dump).write_text(json.dumps(dump(pathlib.Path(args.tree), args.only, args.j)))
        return 0
    if not args.base:
        print("ptx_same: give the revision to compare with, e.g. HEAD~1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ptx_same-") as tmp:
        work = pathlib.Path(tmp)
        add = subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", str(work / "base"), args.base], cwd=ROOT
        )
        if add.returncode:
            print(f"ptx_same: no revision {args.base!r} here; give a commit, branch or tag", file=sys.stderr)
            return 2
        try:
            for name, tree in (("base", work / "base"), ("here", ROOT)):
                _dump_in(tree, args.only, args.j, work / f"{name}.json")
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(work / "base")], cwd=ROOT, check=False
            )
        base, here = (json.loads((work / f"{n}.json").read_text()) for n in ("base", "here"))
    changed, gone, added, same = compare(base, here)
    for k in changed:
        print(f"CHANGED {k}")
    print(f"{same} same, {len(changed)} changed, {len(gone)} only in {args.base}, {len(added)} only here")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
