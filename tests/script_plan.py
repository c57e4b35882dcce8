"""A device recipe's DRY mode: the one `deepgap run` line a step prints, parsed, validated and planned here.

Why shared: each recipe's test (tests/whole/test_*_script.py) checks that its printed arguments plan the
configurations its header describes, on a GPU and for the CPU smoke; nothing runs.
"""

import argparse
import os
import subprocess
from pathlib import Path

from deepgap.commands.run import add_arguments, build_spec
from deepgap.drive.config import validate
from deepgap.drive.plan import expand


def dry_plan(script: Path, steps: list[str], smoke: bool, store: str) -> list:
    """The plan of the one line ``bash SCRIPT STEPS`` prints with DRY=1 (SMOKE=1 where ``smoke``).

    ``store``: the end of the store path the line must name.
    """
    env = {**os.environ, "DRY": "1", "SMOKE": "1" if smoke else "0"}
    out = subprocess.run(
        ["bash", str(script), *steps],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=script.parent.parent,
    ).stdout.splitlines()
    assert len(out) == 1
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(out[0].split())
    assert args.store.endswith(store)
    spec = validate(build_spec(args))
    return expand(spec, spec.device)
