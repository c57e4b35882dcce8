"""The one-kernel step's benchmark variants (`llm_whole_plan.variant`, issue 51), read here on the CPU.

`benchmarks/whole_decode_phases.py` and `llm_decode_loop.py --whole` time them on a GPU; a variant string they
cannot read would cost that call, so every default one is read here into the tiles it asks for, and a bad one
is a usage error naming what it cannot read.
"""

import dataclasses
import importlib.util

import pytest
from repo_paths import BENCHMARKS

from deepgap.core.errors import UsageError
from deepgap.measure import llm_whole_plan


def _defaults() -> list[str]:
    spec = importlib.util.spec_from_file_location(
        "whole_decode_phases", BENCHMARKS / "whole_decode_phases.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.VARIANTS.split(",")


def test_every_default_variant_reads_as_its_modes_tiles_changed():
    variants = _defaults()
    read = dict(llm_whole_plan.variant(v) for v in variants if "+" not in v)
    assert read == {m: llm_whole_plan.tiles_for(m) for m in ("on", "l2", "ahead")}
    mode, t = llm_whole_plan.variant("on+o=8x4096+down=16x2048")
    assert mode == "on" and t == dataclasses.replace(llm_whole_plan.Tiles(), o=(8, 4096), down=(16, 2048))
    led = llm_whole_plan.variant("ahead+lead_kb=64")[1]
    assert led == dataclasses.replace(llm_whole_plan.tiles_for("ahead"), lead_kb=64)
    assert all(llm_whole_plan.variant(v) for v in variants)


@pytest.mark.parametrize(
    "variant, said",
    [
        ("off", "no mode of the one-kernel step"),
        ("on+bands=8", "'bands=8' is not a tile field's NAME=VALUE"),
        ("l2+lead_kb=", "NAME=VALUE"),
        ("l2+o=8xwide", "NAME=VALUE"),
        ("on+o=8", "NAME=VALUE"),  # a band × K step is two numbers
        ("on+lead_kb=64x2", "NAME=VALUE"),
    ],
)
def test_a_variant_it_cannot_read_is_a_usage_error(variant, said):
    with pytest.raises(UsageError, match=said):
        llm_whole_plan.variant(variant)
