"""``deepgap merge A.sqlite B.sqlite … -o all.sqlite``: stores from separate machines, combined.

Idempotent (merging again adds nothing), atomic (the output is renamed into place when complete),
and strict about schema versions; see `deepgap.fleet.merge`. ``report`` and ``compare`` then read
the merged store like any other: each machine's runs keep their own environment fingerprints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from deepgap.commands.filter_flags import add_run_flag

NAME = "merge"
HELP = "combine stores from several machines into one (idempotent; -o OUTPUT)"
ORDER = 6


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    p.add_argument("stores", nargs="+", metavar="STORE", help="stores to merge (e.g. t4.sqlite l4.sqlite)")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="STORE",
        help="merged store; created, or extended when it exists",
    )
    p.add_argument(
        "--on-conflict",
        choices=("error", "first"),
        default="error",
        help="a configuration stored twice with different numbers: error (default) or keep the first",
    )
    add_run_flag(p, "every run of every store")
    p.add_argument("--json", action="store_true", help="print what was merged as JSON")
    p.add_argument(
        "--redact",
        action="store_true",
        help="replace host names, GPU serials/UUIDs, node ids and addresses in the output with "
        "keyed tokens that cannot be reversed (merge S -o S --redact redacts S in place)",
    )


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.fleet.merge import merge
    from deepgap.store import writelock

    # merging replaces the output file: no run, serve or other merge may write it meanwhile
    with writelock.exclusive(args.output, "merge into"):
        rep = merge(args.stores, args.output, on_conflict=args.on_conflict, runs=args.run, redact=args.redact)
    if args.json:
        print(json.dumps(dataclasses.asdict(rep)))
        return 0
    print(
        f"merged {len(args.stores)} store(s) into {rep.output}: {rep.runs_total} runs ({rep.runs_added} new), "
        f"{rep.results_total} results ({rep.results_added} new, {rep.results_present} already there)"
    )
    for c in rep.conflicts:
        print(f"  conflict (kept the first): {c}")
    return 0
