"""`ConfigSpec.kv_cache`, the decode KV cache's format: a key-only field that leaves every stored key as it was.

Why these checks: a stored run resumes and merges by its configurations' keys, so a configuration without
the field (every one measured before the axis, every "auto" one after it) must keep its key byte for byte;
an fp8-cache configuration is another configuration, so its key differs and names the format.
"""

from __future__ import annotations

import sqlite3

import pytest
from packed_stores import packed, unpack
from repo_paths import FIXTURES

from deepgap.core.records import KEY_ONLY_FIELDS, ConfigSpec, kv_cache_label

# a decode configuration's key as every store before the axis holds it (written by the code of that time)
DECODE_KEY = (
    '{"batch_size":1,"device":"cpu","engine":"eager","include_transfer":false,"input_len":8,'
    '"memory_format":"nchw","model":"llama-tiny","output_len":5,"precision":"fp32","resolution":8,'
    '"sweep":0,"threads":null}'
)


def _decode(kv_cache: str | None = None) -> ConfigSpec:
    return ConfigSpec(
        "llama-tiny", "eager", "fp32", 1, "cpu", resolution=8, input_len=8, output_len=5, kv_cache=kv_cache
    )


def test_the_default_cache_keeps_the_key_byte_for_byte():
    assert "kv_cache" in KEY_ONLY_FIELDS
    assert _decode().key == DECODE_KEY
    assert ConfigSpec.from_key(DECODE_KEY) == _decode() and ConfigSpec.kv_cache_of(DECODE_KEY) is None


def test_every_committed_key_is_unchanged(tmp_path):
    """The keys a committed store holds (forward rows of two GPUs) read back and re-serialize identically."""
    store = unpack(packed(FIXTURES / "two_gpus_small.sqlite"), tmp_path / "s.sqlite")
    con = sqlite3.connect(store)
    try:
        keys = [r[0] for r in con.execute("SELECT config_key FROM results")]
    finally:
        con.close()
    assert keys
    for k in keys:
        spec = ConfigSpec.from_key(k)
        assert spec.kv_cache is None and spec.key == k and ConfigSpec.kv_cache_of(k) is None


def test_an_fp8_cache_is_another_configuration():
    fp8 = _decode("fp8")
    assert fp8.key != DECODE_KEY and '"kv_cache":"fp8"' in fp8.key
    assert ConfigSpec.kv_cache_of(fp8.key) == "fp8" and ConfigSpec.from_key(fp8.key) == fp8
    assert fp8.group != _decode().group  # an OOM of one format skips only its own larger batches
    assert fp8.label().endswith("decode 8/5 kv-fp8") and "kv-" not in _decode().label()


@pytest.mark.parametrize("key", ["", "not json", "[1, 2]", '{"kv_cache": 8}', '{"kv_cache": ""}', None])
def test_kv_cache_of_a_key_without_one_is_none(key):
    assert ConfigSpec.kv_cache_of(key) is None


def test_the_views_label():
    assert kv_cache_label("fp8") == "fp8 KV cache"
    assert [kv_cache_label(v) for v in (None, "", float("nan"))] == ["", "", ""]
