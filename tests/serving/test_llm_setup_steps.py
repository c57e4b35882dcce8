"""A decoder's serve set-up runs only the steps it prepared, and says its prefill buckets' captures apart.

Why: on a GPU every slot count the step runs at is a compile of the 8B decoder and a CUDA graph. The set-up's
check of continuous batching ran at 2 slots whatever the slot counts served, so a server of 512 slots compiled
a step it never served (session 51). The check now steps over the smallest prepared slot count with room for
its two, the rows past them idle. And the first prefill bucket (where the compile happens) is said apart from
the other captures, so a cold machine's minutes have a name.
"""

from __future__ import annotations

import numpy as np
from clirun import SERVE_TINY_DECODER, deepgap_cli
from conftest import inprocess_serving

from deepgap.core import progress
from deepgap.serving.worker import llm_setup
from deepgap.serving.worker.llm_executor import SlotSteps
from deepgap.serving.worker.llm_prefill import _Replayed


def test_the_setups_check_steps_only_over_prepared_slot_counts(tmp_path, monkeypatch):
    inprocess_serving(monkeypatch)
    ran: list[int] = []
    step = SlotSteps.__call__

    def spy(self, s):
        ran.append(s)
        step(self, s)

    monkeypatch.setattr(SlotSteps, "__call__", spy)
    p = deepgap_cli("serve", *SERVE_TINY_DECODER, "--batch-sizes", "4", "--store", str(tmp_path / "s.sqlite"))
    assert p.returncode == 0, p.stderr
    assert ran and set(ran) == {4}  # the check's two slots stepped as the 4 prepared rows, never as 2
    checked = next(line for line in p.stderr.splitlines() if "continuous batching checked" in line)
    assert "1.000 of greedy tokens as fp32's, each request alone" in checked  # fp32: every token agrees


def test_the_check_pads_the_loops_mask_to_the_prepared_rows():
    seen = []

    class Ex:
        def decode(self, active):
            seen.append(active.tolist())

    class Clock:
        def advance(self, s):
            pass

    llm_setup.Ticking(Ex(), Clock(), 4).decode(np.array([True, False]))
    llm_setup.Ticking(Ex(), Clock()).decode(np.array([True, True]))
    assert seen == [[True, False, False, False], [True, True]]


class _Plan:
    compile_mode = "default"


def test_the_first_prefill_bucket_is_said_apart_and_the_rest_tick_only_when_slow():
    now = [0.0]
    phases = progress.Phases("set-up: ", clock=lambda: now[0])
    each = llm_setup._bucket_phases(phases, _Plan())
    said: list[str] = []
    with progress.sink(said.append):
        now[0] = 60.0
        each(0, 3, 4096)
        now[0] = 62.0
        each(1, 3, 2048)  # 2 s after the last line: quiet
        now[0] = 75.0
        each(2, 3, 64)
        now[0] = 76.0
        phases.done("prefills prepared")
    assert said == [
        "set-up: first prefill bucket compiled and captured in 60.0 s (4096, the largest of 3)",
        "set-up: prefill bucket 3 of 3 captured (15 s into the phase)",
        "set-up: prefills prepared in 16.0 s",
    ]
    assert phases.seconds == {"first prefill bucket compiled and captured": 60.0, "prefills prepared": 16.0}


def test_buckets_are_captured_largest_first_and_each_told_once():
    told, captured = [], []

    class Stub(_Replayed):
        def _capture(self, key):
            captured.append(key)
            return key

    r = Stub.__new__(Stub)
    r.graph, r.graphs = True, {64: "already"}
    r._prepare([256, 128, 64], lambda i, n, key: told.append((i, n, key)))
    assert captured == [256, 128] and told == [(0, 3, 256), (1, 3, 128), (2, 3, 64)]
