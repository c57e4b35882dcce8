"""Where a report goes: its page path checked before any work, and the folder of files beside it.

Why apart from `deepgap.report.page`: ``run --report`` and ``report`` check the output (and ``--screenshot``)
before measuring or reading anything; the check needs none of the page's building.
"""

from __future__ import annotations

import os

from deepgap.core.errors import UsageError
from deepgap.report import interactive as fi
from deepgap.store.paths import check_output_path, check_owned_folder, nearest_existing, probe_write


def check_output(html_path: str, interactive: bool = True, flag: str = "-o") -> str:
    """Absolute output path, or a `UsageError` when it cannot be written (checked before any work).

    ``interactive``: the page will need plotly, so its absence fails here too, before a run or a build;
    ``flag``: the option that named the path (``--screenshot`` too), in the fix.
    """
    if interactive:
        fi.require()
    check_output_path(html_path, "report", stdout_ok=False)  # never a device, FIFO or /dev path
    path = os.path.abspath(html_path)
    if os.path.isdir(path):
        eg = f"{flag} {'shot.png' if flag == '--screenshot' else 'report.html'}"
        raise UsageError(f"{flag} {html_path} is a directory", f"pass a file name, e.g. {eg}")
    probe = nearest_existing(os.path.dirname(path))
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(
            f"cannot write {html_path}: {probe} is not a writable folder", f"pass a writable {flag} path"
        )
    try:
        probe_write(probe)
    except OSError as exc:
        raise UsageError(
            f"cannot write {html_path}: {exc.strerror} in {probe}", f"pass a writable {flag} path"
        ) from None
    check_owned_folder(files_dir(path))  # never replace a folder of the user's
    return path


def files_dir_name(html_path: str) -> str:
    """``report.html`` → ``report_files`` (the folder of PNGs and CSVs beside the page)."""
    return os.path.splitext(os.path.basename(html_path))[0] + "_files"


def files_dir(html_path: str) -> str:
    """The folder of PNGs and CSVs beside the page (absolute): ``/a/report.html`` → ``/a/report_files``."""
    path = os.path.abspath(html_path)
    return os.path.join(os.path.dirname(path), files_dir_name(path))
