"""``deepgap report``: a store → one self-contained HTML page (≤ 3 MB), figures and tables beside it.

The page links nothing outside itself; the PNGs and CSVs go to ``<name>_files/``.

`write_report` is also what ``deepgap run --report`` calls after a run.
"""

from __future__ import annotations

import argparse

from deepgap.commands.filter_flags import add_run_flag, add_store_argument
from deepgap.commands.share_flags import add_shared_output_flags, use_shared_output_flags
from deepgap.core.errors import UsageError

NAME = "report"
HELP = "write a self-contained HTML report (tables, figures, flags) of a store"
ORDER = 4
# the paths it reads and writes: no output may replace an input (cli.check_paths)
READS, WRITES = ("store",), ("output", "screenshot")


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    add_store_argument(p)
    p.add_argument(
        "-o",
        "--output",
        default="report.html",
        help="HTML file (default report.html); PNGs and CSVs go to <name>_files/ beside it",
    )
    add_run_flag(p)
    p.add_argument("--screenshot", metavar="PNG", help="also save a headless-Chromium screenshot of the page")
    p.add_argument("--size", default="1200x900", help="screenshot size WIDTHxHEIGHT (default 1200x900)")
    p.add_argument(
        "--static",
        action="store_true",
        help="PNG figures only, no script; the page says it is static (the default page embeds plotly.js "
        "once, gzipped, about 2 MB, for hover, legend toggles and filters, and needs plotly installed)",
    )
    add_shared_output_flags(
        p, "show host names, GPU serials and UUIDs and the store's full path (redacted by default)"
    )


def write_report(
    store_path: str,
    html_path: str,
    run_ids: list[str] | None = None,
    static: bool = False,
    redact: bool = True,
) -> list[str]:
    """Write the report of ``run_ids`` (default: all runs) of ``store_path``; returns the written paths.

    Redacted unless ``redact`` is False: a report is made to be shared, and a GPU's serial or UUID
    and the host's name identify one machine (issue 35). A disk that fills up while the page and
    its files are written is one line, and the report's temporary folder is removed.
    """
    from deepgap.commands.export import write_fix
    from deepgap.report.page import write_report as _write
    from deepgap.store import guard

    before = guard.READ["redact"]
    guard.READ["redact"] = redact
    try:
        return _write(store_path, html_path, run_ids=run_ids, static=static)
    except OSError as exc:
        raise UsageError(
            f"cannot write {html_path}: {exc.strerror or exc}; nothing was written", write_fix(exc)
        ) from None
    finally:
        guard.READ["redact"] = before


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
        if 0 < w <= 16384 and 0 < h <= 16384:
            return w, h
    except ValueError:
        pass
    raise UsageError(
        f"--size {text!r} is not WIDTHxHEIGHT (1 to 16384 pixels each)", "pass e.g. --size 1200x900"
    )


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.report.page import check_output, find_chromium, screenshot

    redact = use_shared_output_flags(args)
    size = _size(args.size)
    check_output(args.output, interactive=not args.static)  # plotly missing: exit 2 now, not a static page
    if args.screenshot:
        check_output(args.screenshot, interactive=False, flag="--screenshot")
        if find_chromium() is None:
            raise UsageError(
                "--screenshot needs Chromium, which is not installed", "apt-get install chromium"
            )
    paths = write_report(args.store, args.output, run_ids=args.run, static=args.static, redact=redact)
    print(f"wrote {paths[0]} and {len(paths) - 1} PNG/CSV files beside it")
    if args.screenshot:
        print(f"screenshot {screenshot(paths[0], args.screenshot, *size)}")
    return 0
