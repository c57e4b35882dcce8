"""``deepgap check STORE [--recover NEW]``: say what is damaged in a store; save every intact row.

``check`` reads the store as SQLite does, its write-ahead log included, and names who is writing it
(`deepgap.store.diagnose`); ``--recover`` copies it under the store's write lock and saves what any
technique reaches (`deepgap.store.recover`); the damaged file is only read. Exit code 0 when the
store is healthy (or ``--recover`` saved rows into the new store), 2 when it is damaged and nothing
was recovered. docs/store-recovery.md says what each can and cannot save.
"""

from __future__ import annotations

import argparse
import sys

NAME = "check"
HELP = "check a store for damage (integrity, schema, every row decoded); --recover NEW saves every intact row"
ORDER = 7
# the paths it reads and writes: no output may replace an input (cli.check_paths)
READS, WRITES = ("store",), ("recover",)


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    p.add_argument("store", help="store file to check")
    p.add_argument("--recover", metavar="NEW", help="write every intact row into this new store file")


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.store.diagnose import check
    from deepgap.store.recover import check_output, recover

    if args.recover:
        check_output(args.store, args.recover)
    rep = check(args.store)
    print("\n".join(rep.lines()))
    if args.recover:
        rec = recover(args.store, args.recover)
        print(
            f"recovered into {rec.output} ({rec.method}): {sum(rec.saved.values())} row(s) kept, "
            f"{sum(rec.lost.values())} found but lost (undecodable, or their run or result is lost)"
        )
        print("\n".join(rec.lines()))
        return 0
    if rep.foreign and not args.recover:
        print(
            f"deepgap: error: {args.store} is not a deepgap store; pass a store file (or try --recover NEW "
            "if it was one)",
            file=sys.stderr,
        )
        return 2
    if rep.damaged:
        print(
            f"deepgap: error: {args.store} is damaged; `deepgap check {args.store} --recover NEW.sqlite` "
            "saves every intact row",
            file=sys.stderr,
        )
        return 2
    return 0
