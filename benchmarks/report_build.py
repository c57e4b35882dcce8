"""How long does ``deepgap report`` take? CPU-seconds of building the 230-row fixture store's page.

Issue 49's target is a report of 200 rows built in ≤ 20 s on the CPU. Wall time on a shared machine
says more about the neighbours than about the build, so this measures process time (user + sys):
in-process, `time.process_time` around `deepgap.report.page.write_report` (the first build, which
imports matplotlib and the rest, is a warm-up and not counted); as a CLI, the children's user + sys
of ``python -m deepgap report`` (imports included, as a user pays them). Each is the median of
``--repeats`` builds.

The store is `tests/fixtures_multi.build_multi_store` (230 configurations written through
`Store.record`: five engines, quant rows, two sweeps, a CPU run), so no archived store is needed::

    PYTHONPATH=src python benchmarks/report_build.py [--repeats 3] [--static] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _store(folder: str) -> str:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from fixtures_multi import build_multi_store

    path = os.path.join(folder, "multi.sqlite")
    build_multi_store(path)
    return path


def _in_process(store: str, out: str, static: bool, repeats: int, profile: str | None) -> list[float]:
    from deepgap.report.page import write_report

    write_report(store, out, static=static)  # warm-up: imports, caches filled once per process
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        write_report(store, out, static=static)
        times.append(time.process_time() - t0)
    if profile:
        import cProfile

        cProfile.runctx("write_report(store, out, static=static)", globals(), locals(), profile)
    return times


def _cli(store: str, out: str, static: bool, repeats: int) -> list[float]:
    times = []
    import deepgap

    # the CLI runs the same source tree as the in-process builds (PYTHONPATH may name another checkout)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(deepgap.__file__))}
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        cmd = [sys.executable, "-m", "deepgap", "report", "-o", out, store, *(["--static"] if static else [])]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return times


def _each(times: list[float]) -> str:
    return ", ".join(f"{t:.1f}" for t in times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--static", action="store_true", help="build the --static page")
    ap.add_argument("--profile", help="also write a cProfile of one in-process build here")
    ap.add_argument("--no-cli", action="store_true", help="in-process builds only")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        store = _store(folder)
        out = os.path.join(folder, "report.html")
        inproc = _in_process(store, out, args.static, args.repeats, args.profile)
        print(f"in-process: median {statistics.median(inproc):.1f} CPU-s ({_each(inproc)})")
        if not args.no_cli:
            cli = _cli(store, out, args.static, args.repeats)
            print(f"CLI:        median {statistics.median(cli):.1f} CPU-s ({_each(cli)})")


if __name__ == "__main__":
    main()
