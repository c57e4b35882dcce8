"""benchmarks/llm_decode_loop.py's ``--tiles``: a turn's forced tiles by shape, and back to the tuner's.

Why: session 40 timed the step with one GEMV's tile forced against the tuner's choice; a spec read wrong would
time another tile than the row says (``forced_tiles``).
"""

from __future__ import annotations

import pytest
import torch
from repo_paths import imported_benchmark


@pytest.fixture
def loop():
    yield from imported_benchmark("llm_decode_loop")


def test_a_turn_forces_its_tiles_by_shape_and_the_next_gives_them_back(loop, monkeypatch):
    from deepgap.measure.quant import gemv

    monkeypatch.setattr(gemv, "_TUNED", {})
    monkeypatch.setattr(gemv, "fastest", gemv.fastest)  # the turn's wrapper is undone with the test
    loop.force_tiles("14336x4096=8x2048w8t,4096x4096=16x4096w8")
    down = gemv.fastest(("fused", (0,), 14336, 4096, "cuda:0"), None, [], None)
    assert down == gemv.GemvTile(8, 2048, 1, 8, 1, 0, gemv.IN_THREAD.value)
    o = gemv.fastest(("fused", (1,), 4096, 4096, "cuda:0"), None, [], None)
    assert (o.bn, o.bk, o.num_warps, o.reduce_each) == (16, 4096, 8, 1)
    assert "fused plain 14336x4096: 8x2048 s1 w8 st1 reduce-in-thread" in gemv.chosen()
    loop.force_tiles("4096x4096=8x2048w8ta2,4096x28672=4x2048w4ta2r128")
    o = gemv.fastest(("fused", (1,), 4096, 4096, "cuda:0"), None, [], None)
    assert o == gemv.GemvTile(8, 2048, 1, 8, 1, 0, gemv.IN_THREAD.value, ahead=2)
    assert "8x2048 s1 w8 st1 reduce-in-thread ahead 2" in gemv.chosen()
    gate_up = gemv.fastest(("fused", (0, 1), 4096, 28672, "cuda:0"), None, [], None)
    assert (gate_up.bn, gate_up.ahead, gate_up.maxnreg) == (4, 2, 128)
    loop.force_tiles("4096x4096=8x2048w8ta0")  # nothing before the wait
    assert gemv.fastest(("fused", (1,), 4096, 4096, "cuda:0"), None, [], None).ahead == 0
    # qkv's tile as the tuner picks it (a block reduced at the end, four stages), capped at 128 registers
    loop.force_tiles("4096x6144=8x512w4s4br128")
    qkv = gemv.fastest(("fused", (0, 1), 4096, 6144, "cuda:0"), None, [], None)
    assert qkv == gemv.GemvTile(8, 512, 1, 4, 4, 0, 0, maxnreg=128)
    assert "4096x6144: 8x512 s1 w4 st4 maxnreg 128" in gemv.chosen()
    loop.force_tiles("4096x6144=8x512w4s4b")
    assert (
        gemv.fastest(("fused", (0, 1), 4096, 6144, "cuda:0"), None, [], None).describe() == "8x512 s1 w4 st4"
    )
    with pytest.raises(SystemExit, match="'8x512w4s4tb' is not BNxBKwW"):
        loop.force_tiles("4096x6144=8x512w4s4tb")
    with pytest.raises(SystemExit, match="'8x2048w8z' is not BNxBKwW"):
        loop.force_tiles("4096x4096=8x2048w8z")
    loop.force_tiles("tuned")
    assert gemv._TUNED == {}  # the forced choices are gone: the tuner times its own again
    first = gemv.GemvTile(4, 4096, 1, 4, 1, 0, 1)
    assert gemv.fastest(("fused", (0,), 14336, 4096, "cpu"), torch.device("cpu"), [first], None) == first


def test_every_turn_of_the_default_options_is_a_value_the_switches_accept(loop, monkeypatch):
    """Session 43's batch-512 loop stopped at its first step: an unset --pdl reached the switch as ''."""
    from deepgap.core import switches

    names = ("PDL", "SPLIT_KV", "COMBINE", "ATTENTION", "NORM", "ANGLES")
    for k in names:
        monkeypatch.delenv(f"DEEPGAP_DECODE_{k}", raising=False)
    monkeypatch.delenv("DEEPGAP_PDL_CONSTANTS", raising=False)
    runs = list(loop._runs(loop.parser().parse_args(["--out", "x"])))
    defaults = tuple(switches.SWITCHES[f"DEEPGAP_DECODE_{k}"].default for k in names)
    constants = switches.SWITCHES["DEEPGAP_PDL_CONSTANTS"].default
    # what `deepgap run` runs, not the loop's own choice
    assert runs == [(constants, *defaults, "tuned", "own")]
    assert defaults == ("auto", "auto", "kernel", "triton", "handoff", "kernel")
    for k, v in zip(names, runs[0][1:7], strict=True):
        monkeypatch.setenv(f"DEEPGAP_DECODE_{k}", v)
        assert switches.read(f"DEEPGAP_DECODE_{k}") == v
    picked = loop._runs(loop.parser().parse_args(["--out", "x", "--pdl", "off,on", "--harness", "deepgap"]))
    assert [r[1] for r in picked] == ["off", "on"]
    turns = loop._runs(loop.parser().parse_args(["--out", "x", "--constants", "after,ahead,after"]))
    assert [r[0] for r in turns] == [
        "after",
        "ahead",
        "after",
    ]  # `--constants`: DEEPGAP_PDL_CONSTANTS in turn


def test_prefill_turns_are_eager_or_compiled(loop):
    """``--prefill eager,compiled`` times both in one process; a typo stops before the 8B model is built."""
    assert loop.parser().parse_args(["--out", "x"]).prefill == "eager"
    assert loop._prefills("eager,compiled") == ["eager", "compiled"]
    with pytest.raises(SystemExit, match="compile is not one of eager, eager-row-kernel, compiled"):
        loop._prefills("eager,compile")


def test_the_turns_wrapper_takes_what_the_tuner_takes(loop, monkeypatch):
    """Session 46's loops stopped at their first GEMV: the tuner had gained ``weights=``, the wrapper had not."""
    import inspect

    from deepgap.measure.quant import gemv

    monkeypatch.setattr(gemv, "_TUNED", {})
    seen = {}

    def tuner(key, device, cands, call, decode=False, weights=None):
        seen.update(key=key, decode=decode, weights=weights)
        return "timed"

    monkeypatch.setattr(gemv, "fastest", tuner)
    loop.force_tiles("tuned")
    assert list(inspect.signature(gemv.fastest).parameters) == list(inspect.signature(tuner).parameters)
    key = ("fused", (0,), 4096, 6144, "cuda:0")
    assert gemv.fastest(key, None, [], None, decode=True, weights="codes") == "timed"
    assert seen == {"key": key, "decode": True, "weights": "codes"}
