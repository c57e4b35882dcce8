"""tinybert served on the CPU with mixed lengths: the CLI runs that the bucketed and the packed tests share.

Why shared: the bucketed and the packed text servers are searched for capacity, and driven by LoadGen, the
same way; only ``--padding`` differs, and each test asserts what its padding means for the tokens counted.
The caller sets up the in-process worker first (`conftest.inprocess_serving`).
"""

from __future__ import annotations

import json
from typing import Any

from clirun import deepgap_cli

from deepgap.serving.show.tables import text_levels
from deepgap.store import reading


def _serve(store: str, padding: str, min_queries: int, *extra: str) -> dict[str, Any]:
    """``deepgap serve`` of tinybert at lengths 8:2,24:1,60:1 padded by ``padding``: its JSON headline."""
    args = [
        "--model", "tinybert", "--device", "cpu", "--threads", "1", "--batch-sizes", "1,2,4", "--curve-iterations",
        "3", "--min-queries", str(min_queries), "--min-duration", "0.1s", "--no-telemetry", "--seq-len-dist",
        "8:2,24:1,60:1", "--padding", padding, *extra, "--store", store, "--json",
    ]  # fmt: skip
    p = deepgap_cli("serve", *args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def find_capacity(store: str, padding: str) -> dict[str, Any]:
    """A capacity search at p99 ≤ 200 ms, one policy verified for real (at most 600 queries a probe)."""
    return _serve(store, padding, 150, "--find-capacity", "--slo-p99", "200ms", "--verify-policies", "1",
                  "--max-queries", "600")  # fmt: skip


def loadgen_offline(store: str, padding: str) -> tuple[dict[str, Any], Any]:
    """(the JSON headline, the LoadGen levels of `text_levels`) of one Offline run under LoadGen."""
    out = _serve(store, padding, 100, "--scenario", "offline", "--loadgen")
    with reading(store) as s:
        t = text_levels(s)
    return out, t[t["purpose"] == "loadgen"]
