"""The quant engine's tuning cache: keyed, persistent, checked on every hit, ignored when damaged (CPU)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torchvision import models

from deepgap.measure.quant import tunecache
from deepgap.measure.quant.prepare import QuantOptions, prepare_quant
from deepgap.measure.quant.tiles import TileConfig

SHAPE = tunecache.LayerShape("int8", 3136, 64, 64, 3, 1, 1, "int8", "int8", None, True)
PARTS = {"device": "NVIDIA H100 80GB HBM3", "cc": "9.0", "torch": "2.11", "triton": "3.6"}


def test_a_choice_survives_a_new_process_and_other_keys_do_not_see_it(tmp_path):
    cache = tunecache.TuneCache(PARTS, tmp_path)
    choice = tunecache.Choice("triton", TileConfig(64, 128, 64, 8, 4, 1, early_res=True), 2.5e-6, 4.0e-6)
    cache.put(SHAPE, choice)
    assert tunecache.TuneCache(PARTS, tmp_path).get(SHAPE) == choice
    other = tunecache.TuneCache({**PARTS, "triton": "3.7"}, tmp_path)
    assert other.get(SHAPE) is None and other.path != cache.path
    wider = tunecache.LayerShape(**{**SHAPE.__dict__, "n": 128})
    assert cache.get(wider) is None


def test_a_damaged_or_foreign_cache_file_is_ignored_and_rewritten(tmp_path):
    cache = tunecache.TuneCache(PARTS, tmp_path)
    cache.path.write_text("{not json")
    assert tunecache.TuneCache(PARTS, tmp_path).get(SHAPE) is None
    cache.path.write_text(json.dumps({"key": {"device": "else"}, "layers": {SHAPE.key(): {}}}))
    assert tunecache.TuneCache(PARTS, tmp_path).get(SHAPE) is None
    cache.path.write_text(json.dumps({"key": PARTS, "layers": {SHAPE.key(): {"backend": "triton"}}}))
    fresh = tunecache.TuneCache(PARTS, tmp_path)
    assert fresh.get(SHAPE) is None  # a malformed entry counts as absent
    fresh.put(SHAPE, tunecache.Choice("torch", None, 1e-5, None))
    assert json.loads(cache.path.read_text())["layers"][SHAPE.key()]["backend"] == "torch"


def test_the_key_names_device_versions_and_kernel_sources():
    parts = tunecache.device_key("cpu")
    assert {"device", "cc", "torch", "triton", "sources"} <= set(parts)
    assert parts["torch"] == torch.__version__ and len(parts["sources"]) == 16


@pytest.mark.parametrize("env", ["DEEPGAP_QUANT_SMALL_BATCH", "DEEPGAP_QUANT_CONV_TMA"])
def test_a_switch_that_changes_the_tiles_offered_keys_a_cache_of_its_own(monkeypatch, env):
    """Tuned with the tiles offered (``…=on``) is never a hit without them (``…=off``), nor back."""
    monkeypatch.setenv(env, "on")
    on = tunecache.device_key("cpu")
    monkeypatch.setenv(env, "off")
    off = tunecache.device_key("cpu")
    changed = {k for k in on.keys() | off.keys() if on.get(k) != off.get(k)}
    assert len(changed) == 1 and changed <= set(on) - set(off), changed
    if env == "DEEPGAP_QUANT_SMALL_BATCH":  # 'split' offers fewer tiles than 'on' (no spread ones)
        monkeypatch.setenv(env, "split")
        split = tunecache.device_key("cpu")
        assert split.keys() == on.keys() and split != on and split != off


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    return models.resnet18().eval()


def _opts(**kw):
    return QuantOptions(calib_images=2, calib_method="max", timing_reps=1, force_backend="torch", **kw)


@pytest.fixture(scope="module")
def tuned_once(resnet18, tmp_path_factory):
    """A first preparation (batch 1, from an empty cache) and the cache folder it left, made once.

    Why shared: each preparation tunes ResNet-18's 19 layers (~2.7 CPU-s); the three tests below each began
    with this same one. A test copies the folder (`_cache_from`) before it writes, so each starts from the
    cache exactly as this preparation left it.
    """
    folder = tmp_path_factory.mktemp("tuned-once")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEEPGAP_CACHE", str(folder))
        first = prepare_quant(resnet18, "int8", 1, 32, "resnet18", device="cpu", opts=_opts())
    return first, folder


def _cache_from(tuned_once, tmp_path, monkeypatch):
    """This test's own copy of `tuned_once`'s cache folder, set as ``DEEPGAP_CACHE``; the first preparation."""
    first, folder = tuned_once
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    monkeypatch.setenv("DEEPGAP_CACHE", str(tmp_path))
    return first


def test_a_second_preparation_reuses_every_choice_and_still_times_the_kernel(
    resnet18, tuned_once, tmp_path, monkeypatch
):
    first = _cache_from(tuned_once, tmp_path, monkeypatch)
    tuned = first.info["tune_cache"]
    # ResNet-18 repeats layer shapes (layer1's four 3×3s): a repeat is a hit within the same preparation
    assert tuned["hits"] + tuned["misses"] == 19 and 0 < tuned["hits"] < tuned["misses"]
    assert sum(t["from_cache"] for t in first.info["layers"]) == tuned["hits"]
    second = prepare_quant(resnet18, "int8", 1, 32, "resnet18", device="cpu", opts=_opts())
    assert second.info["tune_cache"] == {**tuned, "hits": 19, "misses": 0}
    for a, b in zip(first.info["layers"], second.info["layers"], strict=True):
        assert b["from_cache"]
        # the tile and the fp16 time are the cached ones; q vs fp16 is decided again on a fresh q time
        assert b["fp16_s"] == a["fp16_s"] and b["config"] == a["config"]
        assert b["q_s"] is not None and b["gemm"] == a["gemm"] and b["bytes"] == a["bytes"] > 0
    other_batch = prepare_quant(resnet18, "int8", 2, 32, "resnet18", device="cpu", opts=_opts())
    assert other_batch.info["tune_cache"]["misses"] == tuned["misses"]  # another batch: other GEMM shapes
    no_cache = prepare_quant(resnet18, "int8", 1, 32, "resnet18", device="cpu", opts=_opts(use_cache=False))
    assert "tune_cache" not in no_cache.info and not any(t["from_cache"] for t in no_cache.info["layers"])


def test_a_cached_tile_that_is_no_longer_a_candidate_is_tuned_again(
    resnet18, tuned_once, tmp_path, monkeypatch
):
    first = _cache_from(tuned_once, tmp_path, monkeypatch)
    path = tmp_path / "quant" / first.info["tune_cache"]["file"]
    doc = json.loads(path.read_text())
    for entry in doc["layers"].values():  # a Triton tile, while only the torch path is a candidate
        entry.update(backend="triton", config={"bm": 64, "bn": 64, "bk": 64})
    path.write_text(json.dumps(doc))
    again = prepare_quant(resnet18, "int8", 1, 32, "resnet18", device="cpu", opts=_opts())
    assert again.info["tune_cache"]["misses"] == first.info["tune_cache"]["misses"]  # every distinct shape
    assert all(t["kernel"] in ("torch", "cudnn") for t in again.info["layers"])


def test_precompiling_is_skipped_with_its_reason_where_nothing_is_compiled(
    resnet18, tuned_once, tmp_path, monkeypatch
):
    on = _cache_from(tuned_once, tmp_path, monkeypatch)  # precompiling was on (the default) there
    assert on.info["precompile"] == {"kernels": 0, "skipped": "no Triton kernels to compile"}
    off = prepare_quant(resnet18, "int8", 1, 32, "resnet18", device="cpu", opts=_opts(precompile_workers=0))
    assert "precompile" not in off.info


def test_compile_all_calls_each_launch_and_passes_over_one_that_fails():
    """`precompile.compile_all`, which the CNN tiles and the transformer Linears share: every launch is
    called inside `launch.compile_only`, one that raises is not counted and stops nothing."""
    pytest.importorskip("triton.runtime._async_compile")
    from deepgap.measure.quant import launch
    from deepgap.measure.quant.precompile import compile_all

    seen = []

    def ok():
        seen.append(launch._COMPILE_ONLY.get())

    def bad():
        raise RuntimeError("no such tile")

    info = compile_all([ok, bad, ok], workers=2)
    assert seen == [True, True] and info["kernels"] == 2 and info["workers"] == 2
