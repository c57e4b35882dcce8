"""What the quant engine kept in a store's runs: stem, head, split-K tiles, fused pairs, TMA 3×3 tiles, whole, branch.

Why: each A/B of an engine switch (`device_lib.sh`'s ``switch_ab``) asks a store the same question, which the
recipes once each answered with their own inline script. One line per stored configuration.

    python benchmarks/engine_kept.py STORE {stem,head,split,pairs,tma,whole,branch}
"""

from __future__ import annotations

import argparse
import json
import sqlite3


def kept(info: dict, what: str) -> object:
    """The part of one run's ``engine_info`` that ``what`` names."""
    if what == "head":
        head = info.get("head", {})
        row = [t for t in info.get("outside_layers", []) if t.get("name") == "head"]
        return head.get("chosen"), {k: round(v * 1e6, 2) for k, v in head.get("seconds", {}).items()}, row[:1]
    if what == "stem":
        stem = info.get("stem", {})
        return stem.get("chosen"), {k: round(v * 1e3, 4) for k, v in stem.get("seconds", {}).items()}
    if what == "whole":
        w = info.get("whole", {})
        secs = {
            k: (round(v * 1e3, 4) if isinstance(v, float) else v) for k, v in w.get("seconds", {}).items()
        }
        return w.get("mode"), w.get("kept"), w.get("per_layer_s"), secs
    if what == "branch":  # the shortcut convolutions on a second stream (`quant.branch`)
        b = info.get("branch") or {}
        return b.get("chosen"), b.get("side"), {k: round(v * 1e3, 4) for k, v in b.get("seconds", {}).items()}
    if what == "pairs":
        pairs = info.get("pairs", {})
        rows = pairs.get("pairs", [])
        return pairs.get("mode"), [(p["first"], p["kept"], p["pair_s"], p["separate_s"]) for p in rows]
    mark = {"split": "split", "tma": "tma-conv"}[what]
    return [
        (t["name"], t.get("config"), t.get("q_s"))
        for t in info.get("layers", [])
        if mark in str(t.get("config"))
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("store")
    p.add_argument("what", choices=("stem", "head", "split", "pairs", "tma", "whole", "branch"))
    a = p.parse_args()
    rows = sqlite3.connect(a.store).execute(
        "select model, precision, batch_size, extra_json from results where engine = 'quant'"
    )
    for model, prec, batch, extra in rows:
        print(model, prec, batch, a.what, kept(json.loads(extra or "{}").get("engine_info", {}), a.what))


if __name__ == "__main__":
    main()
