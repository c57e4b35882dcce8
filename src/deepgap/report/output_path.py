"""Where a report goes: its page path checked before any work, and the folder of files beside it.

Why apart from `deepgap.report.page`: ``run --report`` and ``report`` check the output (and ``--screenshot``)
before measuring or reading anything; the check needs none of the page's building.
"""

from __future__ import annotations

import os

from deepgap.report import interactive as fi
from deepgap.store.paths import check_output_path, check_owned_folder, writable_file


def check_output(html_path: str, interactive: bool = True, flag: str = "-o") -> str:
    """Absolute output path, or a `UsageError` when it cannot be written (checked before any work).

    ``interactive``: the page will need plotly, so its absence fails here too, before a run or a build;
    ``flag``: the option that named the path (``--screenshot`` too), in the fix.
    """
    if interactive:
        fi.require()
    check_output_path(html_path, "report", stdout_ok=False)  # never a device, FIFO or /dev path
    path = os.path.abspath(html_path)
    writable_file(html_path, flag, "shot.png" if flag == "--screenshot" else "report.html")
    check_owned_folder(files_dir(path))  # never replace a folder of the user's
    return path


def files_dir_name(html_path: str) -> str:
    """``report.html`` → ``report_files`` (the folder of PNGs and CSVs beside the page)."""
    return os.path.splitext(os.path.basename(html_path))[0] + "_files"


def files_dir(html_path: str) -> str:
    """The folder of PNGs and CSVs beside the page (absolute): ``/a/report.html`` → ``/a/report_files``."""
    path = os.path.abspath(html_path)
    return os.path.join(os.path.dirname(path), files_dir_name(path))
