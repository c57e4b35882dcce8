"""The plan crosses every decode configuration with the sweep's KV-cache formats (``--kv-caches``).

"auto" plans ``kv_cache=None`` (the key of every configuration planned before the axis), "fp8" plans
``kv_cache="fp8"``; a forward sweep and a GPU decode sweep's host-CPU part plan no cache format.
"""

from __future__ import annotations

from fixtures_decode import DECODE

from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.plan import expand, host_cpu


def test_each_length_pair_is_crossed_with_each_format():
    plan = expand(validate(SweepSpec(**DECODE, kv_caches=("auto", "fp8"))), "cpu")
    assert [(c.input_len, c.kv_cache, c.batch_size) for c in plan] == [
        (8, None, 1),
        (8, None, 3),
        (8, "fp8", 1),
        (8, "fp8", 3),
        (12, None, 1),
        (12, None, 3),
        (12, "fp8", 1),
        (12, "fp8", 3),
    ]
    assert len({c.key for c in plan}) == len(plan)
    assert len({c.group for c in plan}) == 4  # batches ascend inside each (lengths, format) group


def test_auto_plans_what_the_sweep_planned_before_the_axis():
    auto = expand(validate(SweepSpec(**DECODE)), "cpu")
    again = expand(validate(SweepSpec(**DECODE, kv_caches=("auto", "auto"))), "cpu")
    assert auto == again and all(c.kv_cache is None and '"kv_cache"' not in c.key for c in auto)


def test_fp8_only():
    plan = expand(validate(SweepSpec(**DECODE, kv_caches=("fp8",))), "cpu")
    assert {c.kv_cache for c in plan} == {"fp8"} and len(plan) == 4


def test_the_host_cpu_part_and_a_forward_sweep_plan_no_format():
    gpu = validate(SweepSpec(**{**DECODE, "device": "cuda", "cpu_baseline": True, "kv_caches": ("fp8",)}))
    cpu = host_cpu(gpu)
    assert cpu and all(c.device == "cpu" and c.kv_cache is None for c in cpu)  # the plain decode baseline
    forward = SweepSpec(models=("tinycnn",), batch_sizes=(1,), device="cpu")
    assert all(c.kv_cache is None for c in expand(validate(forward), "cpu"))
