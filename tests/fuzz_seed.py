"""The fuzz tests' draw: which seed, and whether to try everything (``tests/whole/test_fuzz_*``, and
``tests/store/test_damaged_stores.py``'s damaged copies).

Why a seed that changes daily: a fixed draw tried the same pairs every day, so failures that a full sweep
found were never drawn (issue 46). ``DEEPGAP_FUZZ_SEED=N`` repeats a day (the seed is printed on a failure);
``DEEPGAP_FUZZ_FULL=1`` draws everything (minutes: the nightly-style sweep).
"""

from __future__ import annotations

import datetime
import os

SEED = int(os.environ.get("DEEPGAP_FUZZ_SEED") or datetime.date.today().strftime("%Y%m%d"))
FULL = os.environ.get("DEEPGAP_FUZZ_FULL") == "1"
