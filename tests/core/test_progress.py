"""`deepgap.core.progress`: a worker's progress lines reach whoever listens, and phases keep their seconds."""

from __future__ import annotations

from deepgap.core import progress
from deepgap.core.progress import Phases


def test_say_reaches_the_innermost_sink_and_nothing_outside_one():
    outer, inner = [], []
    progress.say("nobody listens")  # no sink: nothing happens, nothing raises
    with progress.sink(outer.append):
        progress.say("a")
        with progress.sink(inner.append):
            progress.say("b")
        progress.say("c")
    progress.say("gone")
    assert (outer, inner) == (["a", "c"], ["b"])


def test_phases_keep_each_phases_seconds_and_say_them_as_they_end():
    now = [100.0]
    heard = []
    with progress.sink(heard.append):
        p = Phases("set-up: ", quiet_s=10.0, clock=lambda: now[0])
        now[0] = 102.5
        p.done("built")
        now[0] = 110.0
        p.done("checked", ": all agree")
    assert p.seconds == {"built": 2.5, "checked": 7.5}
    assert heard == ["set-up: built in 2.5 s", "set-up: checked in 7.5 s: all agree"]


def test_a_phases_steps_are_said_only_after_a_quiet_spell():
    now = [0.0]
    heard = []
    with progress.sink(heard.append):
        p = Phases("x: ", quiet_s=10.0, clock=lambda: now[0])
        for t, step in ((4.0, "one"), (9.9, "two"), (12.0, "three"), (15.0, "four"), (22.5, "five")):
            now[0] = t
            p.tick(step)
        now[0] = 30.0
        p.done("loop")
    # "three" is 12 s after the phase began, "five" 10.5 s after "three"; the others came too soon
    assert heard == ["x: three (12 s into the phase)", "x: five (22 s into the phase)", "x: loop in 30.0 s"]
