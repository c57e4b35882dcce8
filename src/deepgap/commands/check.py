"""``deepgap check STORE [--recover NEW]``: say what is damaged in a store; save what is readable.

The damaged file is only read (see `deepgap.store.recover`). Exit code 0 when the store is healthy (or
``--recover`` wrote the new store), 2 when it is damaged and nothing was recovered.
"""

from __future__ import annotations

import argparse
import sys

NAME = "check"
HELP = "check a store for damage (integrity, every row decoded); --recover NEW saves what is readable"
ORDER = 7


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    p.add_argument("store", help="store file to check")
    p.add_argument("--recover", metavar="NEW", help="write every readable row into this new store file")


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.store.recover import check, recover

    rep, con = check(args.store)
    if con is not None:
        con.close()
    print("\n".join(rep.lines()))
    if args.recover:
        rec = recover(args.store, args.recover)
        lost = sum(rec.lost.values())
        print(f"recovered into {rec.output} ({rec.method}): "
              + ", ".join(f"{n} {t}" for t, n in rec.saved.items())
              + (f"; {lost} row(s) could not be saved" if lost else ""))
        return 0
    if rep.damaged:
        print(f"deepgap: error: {args.store} is damaged; `deepgap check {args.store} --recover NEW.sqlite` "
              "saves what is readable", file=sys.stderr)
        return 2
    return 0
