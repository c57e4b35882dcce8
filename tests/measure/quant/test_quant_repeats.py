"""A quant graph is held to its own bits (`deepgap.measure.quant.repeats`): one that changes between replays fails.

Why: session 55 found ResNet-50 fp8's plain graph at batch 256 and 1024 changing most of its logits from replay to
replay on one H100; the PDL choice had taken that for the PDL graph's fault, and the run stored its numbers.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from deepgap.measure.quant import repeats


class _Drifting:
    """A runner whose output changes at some calls: ``wobble[i]`` is added to element 0 at call i."""

    def __init__(self, wobble):
        self.calls = itertools.count()
        self.wobble = wobble

    def __call__(self, x):
        out = torch.tensor([1.0, float("nan"), 3.0, 4.0])
        i = next(self.calls)
        out[0] += self.wobble[i] if i < len(self.wobble) else 0.0
        out[2] += self.wobble[i] if i < len(self.wobble) else 0.0
        return out


def test_a_runner_that_repeats_itself_passes_nan_included():
    rep = repeats.check(_Drifting([0, 0, 0, 0]), torch.zeros(1))
    assert rep == {"same": True, "replays": 3, "changed": 0, "of": 4, "max_abs": 0.0}
    assert repeats.fault({"repeatable": {"plain": rep, "kept": rep}}) is None
    assert repeats.fault({}) is None  # no graph, nothing checked (the CPU's eager forward)


def test_a_runner_that_changes_at_one_replay_fails_with_what_changed():
    rep = repeats.check(_Drifting([0, 0, 0.5, 0]), torch.zeros(1))
    assert rep == {"same": False, "replays": 3, "changed": 2, "of": 4, "max_abs": 0.5}
    why = repeats.fault({"repeatable": {"plain": {**rep, "same": True}, "kept": rep}})
    assert why.startswith(
        "the kept CUDA graph's logits changed between replays of one input (2 of 4, by up to 0.5)"
    )


@pytest.fixture
def drifting_capture(monkeypatch):
    """Graph capture on the CPU whose replays drift: the static output changes at the second replay."""
    from deepgap.measure import graph_runner

    class Graph:
        def __init__(self, out):
            self.out, self.n = out, 0

        def replay(self):
            self.n += 1
            if self.n == 2:
                self.out.add_(1.0)

    def capture(fn, static_in, device, warmup=0):
        with torch.inference_mode():
            out = fn(static_in)
        return Graph(out), out

    monkeypatch.setattr(graph_runner, "can_capture", lambda device: True)
    monkeypatch.setattr(graph_runner, "capture", capture)


def test_a_drifting_plain_graph_is_kept_unchosen_and_the_engine_reports_it(
    drifting_capture, tmp_path, monkeypatch
):
    """The plain graph drifts: no PDL or branch graph is compared with it, and the engine's faults say why."""
    import torchvision.models as models

    from deepgap.measure.quant.prepare import QuantOptions, _make_runner, prepare_quant

    monkeypatch.setenv("DEEPGAP_CACHE", str(tmp_path))
    torch.manual_seed(0)
    opts = QuantOptions(calib_images=2, calib_method="max", autotune=False, timing_reps=1, force_backend="torch",
                        per_layer_choice=False, cuda_graph=False)  # fmt: skip
    res = prepare_quant(models.resnet18().eval(), "int8", 1, 32, "resnet18", device="cpu", opts=opts)
    _, info = _make_runner(res.net, 1, 32, "cpu", True, pdl="auto")
    assert info.keys() == {"cuda_graph", "repeatable"} and not info["repeatable"]["plain"]["same"]
    assert info["repeatable"]["plain"]["changed"] == 1000  # every logit moved by 1
    assert "the plain CUDA graph's logits changed" in repeats.fault(info)


def test_a_candidate_is_refused_where_two_runs_at_the_full_batch_differ(monkeypatch):
    """`at_batch`: one tensor or a pair's two, compared bit for bit (NaN the same); `tuning.checked_time`'s
    ``same`` asks it on a GPU before timing, and a candidate that differs is refused with what changed."""
    from deepgap.measure.quant import tuning

    fixed = torch.tensor([1.0, float("nan"), 3.0])
    assert repeats.at_batch(lambda: fixed.clone()) is None
    assert repeats.at_batch(lambda: (fixed.clone(), fixed.clone())) is None
    drift = itertools.count()
    moving = lambda: (fixed.clone(), fixed + torch.tensor([0.0, 0.0, next(drift)]))  # noqa: E731
    assert repeats.at_batch(moving) == (
        "not repeatable: 1 of 6 outputs changed between two runs on one input at the full batch"
    )
    assert repeats.at_batch_on_gpu(moving, "cpu") is None  # the interpreter: one thread, no race
    asked = []
    monkeypatch.setattr(
        tuning, "at_batch_on_gpu", lambda run, device: asked.append(device) or "not repeatable"
    )
    monkeypatch.setattr(tuning, "time_s", lambda *a: 1e-3)
    assert tuning.checked_time(lambda: None, moving, 2, "cuda", same=True) == "not repeatable"
    assert tuning.checked_time(lambda: None, moving, 2, "cuda") == 1e-3  # off by default: not asked
    assert (
        tuning.checked_time(lambda: "wrong", moving, 2, "cuda", same=True) == "wrong"
    )  # nor after a failed check
    assert asked == ["cuda"]
