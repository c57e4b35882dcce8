"""The decode sweep's KV-cache axis (``--kv-caches``, `deepgap.measure.llm_workload.KV_CACHES`): parsed, checked.

Bad input is one line naming the problem and the fix, exit 2, and nothing written (no store), as for the
other decode axes (`tests/measure/test_llm_decode_sweep.py`); nothing here measures.
"""

from __future__ import annotations

import argparse

import pytest

from deepgap.cli import main
from deepgap.core.errors import UsageError
from deepgap.drive.config import SweepSpec, validate
from deepgap.measure.llm_workload import KV_CACHES, check_kv_caches, kv_caches_of, kv_itemsize, spec_kv_cache

DECODE = dict(models=("llama-tiny",), precisions=("fp32",), batch_sizes=(1,), device="cpu", workload="decode")


def test_the_names_and_their_spec_values():
    assert KV_CACHES == ("auto", "fp8")
    assert (spec_kv_cache("auto"), spec_kv_cache("fp8")) == (None, "fp8")
    assert kv_caches_of(("fp8", "auto", "fp8")) == ["fp8", None]  # in the order given, each once
    assert SweepSpec().kv_caches == ("auto",)


def test_a_cached_element_s_bytes_one_rule_for_the_sweep_and_serve():
    """fp8 codes: one byte whatever the precision; else the precision's own, bf16 beside 8-bit Linears."""
    assert [kv_itemsize(p, None) for p in ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")] == [
        4,
        4,
        2,
        2,
        2,
        2,
    ]
    assert {kv_itemsize(p, "fp8") for p in ("fp32", "bf16", "fp8", "int8")} == {1}


def test_the_flag_and_the_toml_key(tmp_path):
    from deepgap.commands.run import add_arguments, build_spec
    from deepgap.drive.presets import load_toml

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = ["--workload", "decode", "--models", "llama-tiny", "--device", "cpu", "--kv-caches", "auto,fp8"]
    assert validate(build_spec(p.parse_args(args))).kv_caches == ("auto", "fp8")
    assert build_spec(p.parse_args(args[:-2])).kv_caches == ("auto",)  # the default: the decoder's own dtype
    toml = tmp_path / "d.toml"
    toml.write_text('models = ["llama-tiny"]\nworkload = "decode"\nkv_caches = ["fp8"]\n')
    assert load_toml(str(toml)).kv_caches == ("fp8",)


@pytest.mark.parametrize(
    ("kv", "says"),
    [
        (("fp4",), "unknown KV cache 'fp4'; choose from auto, fp8 (--kv-caches)"),
        (("auto", "FP8"), "unknown KV cache 'FP8'"),
        ((), "no KV cache given; pass e.g. --kv-caches auto"),
    ],
)
def test_check_kv_caches(kv, says):
    with pytest.raises(UsageError) as e:
        check_kv_caches(kv)
    assert says in str(e.value), str(e.value)
    with pytest.raises(UsageError):
        validate(SweepSpec(**DECODE, kv_caches=kv))


def test_an_fp8_only_sweep_checks_its_cache_at_one_byte():
    """A cache within the 1 TiB bound at one byte per element is not refused for its size at the own dtype's."""
    from deepgap.measure.llm_workload import check_decode
    from deepgap.measure.models.llama_config import MAX_CACHE_BYTES, SHAPES

    shape = SHAPES["llama-3.1-8b"]
    total = 2048
    batch = int(MAX_CACHE_BYTES / (total * shape.kv_bytes_per_token(1.5)))  # > 1 TiB at 2 bytes, < at 1
    assert batch * total * shape.kv_bytes_per_token(2) > MAX_CACHE_BYTES
    args = (("llama-3.1-8b",), ("eager",), ("bf16",), (batch,), (1024,), (1024,))
    with pytest.raises(UsageError, match="TiB"):
        check_decode(*args, ("auto", "fp8"))
    check_decode(*args, ("fp8",))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workload", "decode", "--kv-caches", "fp4"], "unknown KV cache 'fp4'; choose from auto, fp8"),
        (["--workload", "decode", "--kv-caches", "auto,fp16"], "unknown KV cache 'fp16'"),
        (["--kv-caches", "fp8"], "--kv-caches is a decode axis; add --workload decode, or drop --kv-caches"),
        (["--kv-caches", "auto,fp8"], "--kv-caches is a decode axis"),
        (["--kv-caches", "fp4"], "unknown KV cache 'fp4'"),  # the unknown value first: the fix that matters
        (["--workload", "decode", "--kv-caches", "fp8,"], "has an empty item"),
    ],
)
def test_the_cli_refuses_before_anything_is_written(tmp_path, capsys, args, says):
    out = tmp_path / "out"
    out.mkdir()
    argv = ["run", "--models", "llama-tiny", "--device", "cpu", "--quiet", *args]
    assert main([*argv, "--store", str(out / "s.sqlite")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert err.startswith("deepgap: error: ")
    assert list(out.iterdir()) == []
