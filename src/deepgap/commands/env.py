"""``deepgap env``: the environment fingerprint and what can run here, and why not."""

from __future__ import annotations

import argparse
import json

NAME = "env"
HELP = "show the environment fingerprint and which engines/precisions can run here (and why not)"
ORDER = 11


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.api import probe
    from deepgap.core.precision import PRECISIONS
    from deepgap.core.records import ConfigSpec
    from deepgap.measure.engines import ENGINES, load_engines

    found = probe(args.device)  # in a worker process
    device, env, caps = found.device, found.env, found.caps
    load_engines()
    matrix: dict[str, dict[str, str]] = {}
    for name in ENGINES.names():
        eng = ENGINES.get(name)()
        matrix[name] = {}
        for p in PRECISIONS:
            cfg = ConfigSpec(model="resnet50", engine=name, precision=p, batch_size=1, device=device)
            why = eng.available() or eng.supports(cfg, caps)
            matrix[name][p] = "yes" if why is None else f"no: {why}"
    if args.json:
        print(json.dumps({"environment": env, "can_run": matrix}, indent=2, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"torch {env['torch']}, {env['torch_build']} build")
    t = Table("key", "value", title="environment")
    for k, v in env.items():
        t.add_row(k, str(v))
    console.print(t)
    m = Table("engine", *PRECISIONS, title=f"what can run on {device}")
    for name, row in matrix.items():
        m.add_row(name, *(row[p] for p in PRECISIONS))
    console.print(m)
    return 0
