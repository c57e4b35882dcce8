"""benchmarks/whole_decode_phases.py's variants (issue 51): what the next GPU call sweeps, read here on the CPU.

The sweep itself needs a GPU; a variant string it cannot read would cost that call, so every default variant
is read here into the tiles it asks for, and a bad one stops with the reason before the model is built.
"""

import dataclasses
import importlib.util

import pytest
from repo_paths import BENCHMARKS

from deepgap.measure import llm_whole_plan


def _script():
    spec = importlib.util.spec_from_file_location(
        "whole_decode_phases", BENCHMARKS / "whole_decode_phases.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_default_variant_reads_as_its_modes_tiles_changed():
    phases = _script()
    read = dict(phases.tiles(v) for v in phases.VARIANTS.split(",") if "+" not in v)
    assert read == {m: llm_whole_plan.tiles_for(m) for m in ("on", "l2", "ahead")}
    mode, t = phases.tiles("on+o=8x4096+down=16x2048")
    assert mode == "on" and t == dataclasses.replace(llm_whole_plan.Tiles(), o=(8, 4096), down=(16, 2048))
    assert phases.tiles("ahead+lead_kb=64")[1] == dataclasses.replace(
        llm_whole_plan.tiles_for("ahead"), lead_kb=64
    )
    assert all(phases.tiles(v) for v in phases.VARIANTS.split(","))


@pytest.mark.parametrize(
    "variant, said",
    [
        ("off", "begin it with a mode"),
        ("on+bands=8", "'bands=8' is not NAME=VALUE"),
        ("l2+lead_kb=", "NAME=VALUE"),
    ],
)
def test_a_variant_it_cannot_read_stops_with_the_reason(variant, said):
    with pytest.raises(SystemExit, match=said):
        _script().tiles(variant)
