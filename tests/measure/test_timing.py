"""The timing protocol with a scripted clock: exact expectations, no real time."""

import random

import pytest

from deepgap.measure.timing import HostClock, TimingProtocol, run_protocol


class ScriptedClock:
    """Each step advances virtual time by the next scripted duration."""

    def __init__(self, durations_s):
        self.durations = list(durations_s)
        self.t_ns = 0
        self.steps = 0
        self.syncs = 0

    def step(self):
        self.t_ns += int(self.durations[self.steps % len(self.durations)] * 1e9)
        self.steps += 1

    def sync(self):
        self.syncs += 1

    def now_ns(self):
        return self.t_ns

    def now_s(self):
        return self.t_ns * 1e-9


def test_fixed_protocol_counts_and_values():
    c = ScriptedClock([0.010])
    clock = HostClock(sync=c.sync, clock_ns=c.now_ns)
    t = run_protocol(c.step, clock, TimingProtocol(warmup=4, iterations=5, repeats=3), now=c.now_s)
    assert c.steps == 4 + 3 * (5 + 5)  # warm-up, then per repeat: 5 timed + a 5-iteration window
    assert [len(s) for s in t.samples_s] == [5, 5, 5]
    assert all(v == pytest.approx(0.010) for s in t.samples_s for v in s)
    assert all(n == 5 and sec == pytest.approx(0.050) for n, sec in t.windows)
    assert t.window_throughput(8) == pytest.approx(800.0)
    assert t.ci_met is None


def test_window_extends_to_min_time():
    c = ScriptedClock([0.010])
    clock = HostClock(sync=c.sync, clock_ns=c.now_ns)
    protocol = TimingProtocol(warmup=0, iterations=5, repeats=1, min_time_s=1.0)
    t = run_protocol(c.step, clock, protocol, now=c.now_s)
    assert t.windows[0][0] == 100 and t.windows[0][1] == pytest.approx(1.0)


def test_adaptive_stops_when_target_met():
    c = ScriptedClock([0.010, 0.0101, 0.0099, 0.0100, 0.0102])
    clock = HostClock(sync=c.sync, clock_ns=c.now_ns)
    protocol = TimingProtocol(warmup=0, iterations=10, repeats=2, target_ci=0.05)
    t = run_protocol(c.step, clock, protocol, now=c.now_s)
    assert t.ci_met is True and len(t.samples_s) == 2


def test_adaptive_gives_up_at_max_time_and_says_so():
    c = ScriptedClock([0.01, 0.05, 0.002, 0.09, 0.03, 0.07, 0.001])  # hopelessly noisy
    clock = HostClock(sync=c.sync, clock_ns=c.now_ns)
    protocol = TimingProtocol(warmup=0, iterations=10, repeats=1, target_ci=0.001, max_time_s=3.0)
    t = run_protocol(c.step, clock, protocol, now=c.now_s)
    assert t.ci_met is False
    assert len(t.samples_s) > 1  # it tried more repeats
    assert t.elapsed_s >= 3.0 and t.elapsed_s < 3.0 + 1.0  # stopped within one repeat of the cap


def test_adaptive_bootstraps_again_only_after_four_times_its_cost_of_repeats(monkeypatch):
    """The stop rule's bootstrap is spaced by what it costs, so it never takes more than a fifth of the loop."""
    import deepgap.measure.timing as timing

    rng = random.Random(7)
    c = ScriptedClock([rng.uniform(0.001, 0.009) for _ in range(1009)])  # noisy: never meets its target
    sizes: list[int] = []
    real = timing.median_ci_halfwidth_rel

    def bootstrap(x):  # each costs 0.2 s of the scripted clock, about five repeats of 20 steps
        sizes.append(len(x))
        c.t_ns += int(0.2e9)
        return real(x)

    monkeypatch.setattr(timing, "median_ci_halfwidth_rel", bootstrap)
    clock = HostClock(sync=c.sync, clock_ns=c.now_ns)
    protocol = TimingProtocol(warmup=0, iterations=10, repeats=2, target_ci=0.001, max_time_s=30.0)
    t = run_protocol(c.step, clock, protocol, now=c.now_s)
    n = sum(len(s) for s in t.samples_s)
    assert t.ci_met is False and sizes[0] == 20 and sizes[-1] == n  # after the fixed repeats, and at the end
    # 0.8 s of repeats (about 0.1 s each: 10 timed steps and a 10-step window) between two bootstraps
    assert all(b - a >= 50 for a, b in zip(sizes[:-2], sizes[1:-1], strict=True))
    assert len(sizes) * 0.2 <= 30.0 / 5 + 0.4  # the bootstraps took at most a fifth of the 30 s
    assert t.ci_halfwidth_rel == pytest.approx(real(t.pooled))


def test_a_repeat_longer_than_four_bootstraps_is_checked_after_every_repeat(monkeypatch):
    import deepgap.measure.timing as timing

    sizes: list[int] = []
    real = timing.median_ci_halfwidth_rel
    monkeypatch.setattr(
        timing, "median_ci_halfwidth_rel", lambda x: sizes.append(len(x)) or real(x)
    )  # no cost
    rng = random.Random(3)
    c = ScriptedClock([rng.uniform(0.001, 0.009) for _ in range(1009)])
    clock = HostClock(sync=c.sync, clock_ns=c.now_ns)
    protocol = TimingProtocol(warmup=0, iterations=10, repeats=2, target_ci=0.001, max_time_s=3.0)
    run_protocol(c.step, clock, protocol, now=c.now_s)
    assert sizes == list(range(20, sizes[-1] + 1, 10))  # one bootstrap a repeat, as before
