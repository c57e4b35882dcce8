"""``deepgap list models|engines|presets|precisions``."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

NAME = "list"
HELP = "list models, engines, presets or precisions"
ORDER = 10


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    p.add_argument("what", choices=["models", "engines", "presets", "precisions"])
    p.add_argument("--all", action="store_true", help="include test and fault-injection models")


def main(args: argparse.Namespace) -> int:  # noqa: D103
    console = Console()
    if args.what == "models":
        from deepgap.measure.models import MODELS

        t = Table("model", "family", "resolution", "description")
        for name in MODELS.names():
            e = MODELS.get(name)
            if e.hidden and not args.all:
                continue
            size = f"seq {e.default_resolution}" if e.is_text else str(e.default_resolution)
            t.add_row(name, e.family, size, e.description)
        t.add_row("timm:<name>", "timm", "model's", "any timm model, when timm is installed")
    elif args.what == "engines":
        from deepgap.measure.engines import ENGINES, load_engines

        load_engines()
        t = Table("engine", "precisions", "inputs (--inputs)", "available here", "description")
        for name in ENGINES.names():
            eng = ENGINES.get(name)()
            why = eng.available()
            t.add_row(
                name,
                ",".join(eng.precisions),
                ",".join(eng.inputs),
                "yes" if why is None else f"no: {why}",
                eng.description,
            )
    elif args.what == "presets":
        from deepgap.drive.presets import PRESETS

        t = Table("preset", "what", "configurations")
        for name, (desc, spec) in PRESETS.items():
            from deepgap.drive.plan import expand

            n = len(expand(spec, "cuda"))  # engines paired with the precisions they run, every sweep pass
            t.add_row(name, desc, str(n))
    else:
        from deepgap.core.precision import PRECISIONS

        t = Table("precision")
        for p in PRECISIONS:
            t.add_row(p)
    console.print(t)
    return 0
