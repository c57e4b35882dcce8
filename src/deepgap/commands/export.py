"""``deepgap export``: results (and optionally raw samples) as CSV, Parquet or JSON.

Written to a temporary file and renamed, so a failed export leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from deepgap.commands.filter_flags import add_run_flag, add_store_argument
from deepgap.commands.share_flags import add_shared_output_flags, use_shared_output_flags
from deepgap.core.errors import UsageError
from deepgap.store.paths import STDOUT, check_output_path, make_folders, remove_folders, writable_file

NAME = "export"
HELP = "export results as csv, parquet or json"
ORDER = 3
RAW_STDOUT = True  # -o - writes the data itself: unchanged (cli.SafeStream escapes console views)
# the paths it reads and writes: no output may replace an input (cli.check_paths)
READS, WRITES = ("store",), ("output",)

# -o's suffix → the format written where --format is not given (`output_format`)
FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".json": "json"}


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    add_store_argument(p)
    p.add_argument(
        "--format",
        choices=sorted(set(FORMATS.values())),
        default=None,
        help="csv, parquet or json (default: from -o's suffix, .csv/.parquet/.pq/.json; csv otherwise)",
    )
    p.add_argument("-o", "--output", required=True, help="output file, or - for stdout (csv, json)")
    add_run_flag(p)
    p.add_argument(
        "--samples", action="store_true", help="per-iteration latencies (long format) instead of results"
    )
    add_shared_output_flags(
        p, "keep host names, GPU serials/UUIDs, home and cache paths (redacted by default)"
    )


def export_frame(store_path: str, run_ids: list[str] | None = None, samples: bool = False):
    """The DataFrame `export` writes: one row per result, or one per timed iteration."""
    import pandas as pd

    from deepgap.render.formatting import without_default_inputs
    from deepgap.store import Store

    store = Store(store_path, readonly=True)
    try:
        store.check_runs(run_ids)
        df = store.results_frame(run_ids)
        if not samples:
            from deepgap.commands.decode_view import export_decode

            df["extra"] = [json.dumps(e.to_json(), sort_keys=True) for e in df["extra"]]
            # input_mode: where a row has a resident input; decode rows after, in their own columns
            return export_decode(store, run_ids, with_tail(without_default_inputs(df)))
        rows = []
        dec = store.decode_frame(run_ids)  # a decode row's samples: each decode step's seconds (TPOT)
        ids = [*df["result_id"], *dec["result_id"]]
        for rid, key in zip(ids, [*df["config_key"], *dec["config_key"]], strict=True):
            for rep, arr in enumerate(store.samples(int(rid))):
                rows += [(int(rid), key, rep, i, float(v)) for i, v in enumerate(arr)]
        return pd.DataFrame(rows, columns=["result_id", "config_key", "repeat", "iteration", "latency_s"])
    finally:
        store.close()


def with_tail(df):
    """The frame with each row's tail named beside its ``latency_p99_s`` (docs/reading-results.md).

    Why: ``latency_p99_s`` and its CI stay (scripts read them) but are a p99 only where n ≥ 368 calls
    support one; below that the honest figure is the sample maximum. ``latency_tail_s`` is that figure,
    ``latency_tail_kind`` "p99" or "max" and ``latency_tail_label`` "p99 of n=400" / "max of n=20".
    """
    from deepgap.analysis.tails import of_measurement

    if df.empty:
        return df.assign(latency_tail_s=[], latency_tail_kind=[], latency_tail_label=[])
    t = [of_measurement(r) for r in df.to_dict("records")]
    ok = (df["status"] == "ok").to_list() if "status" in df else [True] * len(df)
    return df.assign(
        latency_tail_s=[x.seconds if k else float("nan") for x, k in zip(t, ok, strict=True)],
        latency_tail_kind=[x.kind if k else "" for x, k in zip(t, ok, strict=True)],
        latency_tail_label=[x.name() if k and x.kind else "" for x, k in zip(t, ok, strict=True)],
    )


def check_folder(path: str) -> str:
    """The output's folder, after proving a file can be created there (a probe, not permission bits).

    The output is written by replacing it, so it must not be a device, FIFO or system path
    (``-o /dev/null`` would replace the system's); ``-o -`` writes to stdout instead.
    """
    check_output_path(path)
    if path == STDOUT:
        return ""
    # missing folders are made when the file is written (`write_frame`), as report -o does
    writable_file(path, "-o", "results.csv", ".deepgap-export-")
    return os.path.dirname(os.path.abspath(path))


def write_frame(df, path: str, fmt: str) -> None:
    """Write atomically (temp file + rename); ``-`` writes CSV or JSON to stdout.

    A disk with room for the probe but not for the file (``ENOSPC`` mid-write) leaves nothing: the
    temporary file is removed and the error is one line.
    """
    folder = check_folder(path)
    if path == STDOUT:
        if fmt == "parquet":
            raise UsageError(
                "parquet is binary and does not go to stdout (-o -)", "pass a file, e.g. -o results.parquet"
            )
        text = df.to_csv(index=False) if fmt == "csv" else df.to_json(orient="records", indent=1) + "\n"
        sys.stdout.write(text)
        return
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise UsageError(
                "parquet export needs pyarrow", "pip install pyarrow, or use --format csv"
            ) from None
    made = make_folders(folder)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".deepgap-export-")
    os.close(fd)
    try:
        if fmt == "csv":
            df.to_csv(tmp, index=False)
        elif fmt == "parquet":
            df.to_parquet(tmp, index=False)
        else:
            df.to_json(tmp, orient="records", indent=1)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 is not what a plain file gets
        os.replace(tmp, path)
    except BaseException as exc:
        os.unlink(tmp)
        remove_folders(made)  # nothing half-written, no stray folders
        if isinstance(exc, OSError):
            raise UsageError(
                f"cannot write {path}: {exc.strerror or exc}; nothing was written", write_fix(exc)
            ) from None
        raise


def write_fix(exc: OSError) -> str:
    """The fix for an output that could not be written: disk space only where the disk was full."""
    import errno

    return "free disk space or pass another -o path" if exc.errno == errno.ENOSPC else "pass another -o path"


def output_format(path: str, flag: str | None) -> str:
    """The format to write: ``--format``, else the one ``-o``'s suffix names, else csv.

    Why: ``-o results.parquet`` wrote CSV text under a parquet name (``--format`` was csv by default),
    which ``pandas.read_parquet`` then refused. A flag that contradicts the suffix is refused.
    """
    named = FORMATS.get(os.path.splitext(path)[1].lower()) if path != STDOUT else None
    if flag and named and flag != named:
        raise UsageError(
            f"--format {flag} but -o {path} names a {named} file",
            f"drop --format, or pass -o with a .{flag} suffix",
        )
    return flag or named or "csv"


def main(args: argparse.Namespace) -> int:  # noqa: D103
    use_shared_output_flags(args)  # an export is made to be shared: redacted unless --no-redact
    fmt = output_format(args.output, args.format)
    check_folder(args.output)
    df = export_frame(args.store, args.run, args.samples)
    write_frame(df, args.output, fmt)
    if args.output != STDOUT:
        print(f"wrote {len(df)} rows to {args.output}")
    return 0
