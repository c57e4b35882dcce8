"""The exit code of a command that measures: 1, with one line on stderr, when nothing was measured.

Why shared: a sweep or a profile whose every configuration was skipped or failed (``--engines quant`` on a
CPU, a trace folder that could not be written) exited 0, so a script went on to report an empty run. The
rows stay stored with their reasons; the line says where to read them.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence


def measured_or_1(statuses: Sequence[str], what: str, where: str) -> int:
    """0 when some status is ``ok`` (or nothing was asked); else 1, naming the statuses and ``where``."""
    if not statuses or "ok" in statuses:
        return 0
    counts = Counter(statuses)
    print(
        f"deepgap: no {what} was measured ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}); {where}",
        file=sys.stderr,
    )
    return 1
