"""While a fleet run measures, other processes see each result as it is stored (and a kill keeps it).

The regression: the lanes' prelude opened a second `Store` on the file while the driver's was open;
its header check's plain ``open``/``close`` dropped this process's POSIX locks, SQLite's included, so
the next reader in another process deleted the write-ahead log the driver kept writing to.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


def _count_elsewhere(store: str) -> int:
    """The stored results as another process (a ``deepgap show``, a poller) sees them."""
    code = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "print(c.execute('SELECT count(*) FROM results').fetchone()[0]); c.close()"
    )
    out = subprocess.run([sys.executable, "-c", code, store], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.slow
def test_another_process_sees_every_result_of_a_fleet_run_as_it_is_stored(tmp_path, tiny_spec):
    from deepgap.fleet.launch import Fleet, run_fleet

    store = str(tmp_path / "s.sqlite")
    seen: list[tuple[int, int]] = []
    stored = [0]

    def on_event(ev):
        if ev.result is not None:
            stored[0] += 1
            seen.append((stored[0], _count_elsewhere(store)))

    run_fleet(
        tiny_spec.replace(thermal_warmup=True, thermal_timeout_s=2.0, thermal_window_s=0.3),
        store,
        Fleet(devices=["fake-cpu:0"]),
        on_event=on_event,
    )
    assert seen == [(1, 1), (2, 2)]
