import numpy as np
import pytest

from deepgap.core import stats


@pytest.fixture
def samples():
    return np.random.default_rng(7).lognormal(mean=-6.0, sigma=0.2, size=500)


def test_summary_matches_numpy(samples):
    s = stats.summarize(samples)
    assert s.n == 500
    assert s.mean_s == pytest.approx(samples.mean())
    assert s.std_s == pytest.approx(samples.std(ddof=1))
    assert s.min_s == samples.min() and s.max_s == samples.max()
    for name, q in (("p5_s", 5), ("median_s", 50), ("p90_s", 90), ("p95_s", 95), ("p99_s", 99)):
        assert getattr(s, name) == pytest.approx(np.percentile(samples, q))


def test_bootstrap_ci_brackets_the_statistic_and_is_reproducible(samples):
    s = stats.summarize(samples)
    assert s.median_ci_low_s < s.median_s < s.median_ci_high_s
    assert s.p99_ci_low_s <= s.p99_s <= s.p99_ci_high_s
    assert stats.summarize(samples) == s  # fixed seed: same interval every time


def test_bootstrap_ci_covers_true_median_about_95_percent():
    rng = np.random.default_rng(1)
    true_median = np.exp(0.0)  # lognormal(0, 1) median
    hits = 0
    for _ in range(200):
        lo, hi = stats.bootstrap_ci(rng.lognormal(0.0, 1.0, size=60), n_resamples=400)
        hits += lo <= true_median <= hi
    assert 0.88 <= hits / 200 <= 0.99


def test_ci_narrows_with_more_samples():
    rng = np.random.default_rng(3)

    def w(n):
        return np.subtract(*stats.bootstrap_ci(rng.normal(1.0, 0.1, n))[::-1])

    assert w(2000) < w(50) / 3


def test_degenerate_inputs():
    one = stats.summarize([0.5])
    assert one.n == 1 and one.std_s == 0.0 and one.median_ci_low_s == one.median_ci_high_s == 0.5
    const = stats.summarize([2.0] * 10)
    assert const.median_ci_low_s == const.median_ci_high_s == 2.0
    with pytest.raises(ValueError):
        stats.summarize([])


def test_throughput_ci_is_inverse_of_latency_ci(samples):
    s = stats.summarize(samples)
    t, lo, hi = stats.throughput_from_latency(32, s)
    assert t == pytest.approx(32 / np.median(samples))
    assert lo == pytest.approx(32 / s.median_ci_high_s) and hi == pytest.approx(32 / s.median_ci_low_s)
    assert lo < t < hi


def test_cv_and_ratio_ci():
    assert stats.coefficient_of_variation([1.0]) is None
    assert stats.coefficient_of_variation([1.0, 2.0, 3.0]) == pytest.approx(np.std([1, 2, 3], ddof=1) / 2.0)
    rng = np.random.default_rng(5)
    a, b = rng.normal(2.0, 0.05, 300), rng.normal(1.0, 0.02, 300)
    point, lo, hi = stats.ratio_ci(a, b)
    assert point == pytest.approx(np.median(a) / np.median(b))
    assert lo < point < hi and lo > 1.9 and hi < 2.1


def test_adaptive_stop_rule():
    rng = np.random.default_rng(9)
    assert stats.median_ci_halfwidth_rel([1.0, 1.0]) == float("inf")  # too few samples to judge
    tight = stats.median_ci_halfwidth_rel(rng.normal(1.0, 0.001, 200))
    loose = stats.median_ci_halfwidth_rel(rng.normal(1.0, 0.2, 20))
    assert tight < 0.001 < loose


def _two_level(rng, n_groups, n_per, sd_between, sd_within, mu=5.0):
    return [mu + rng.normal(0, sd_between) + rng.normal(0, sd_within, n_per) for _ in range(n_groups)]


def test_hierarchical_bootstrap_covers_across_processes_where_the_pooled_one_does_not():
    """Known answer: processes whose own speed varies as much as their samples. The true median is ``mu``.

    The nominal 95% two-level interval should hold it in most datasets; a bootstrap of the pooled samples,
    which treats every sample as independent, misses it in most (the issue's fresh-machine finding).
    """
    import numpy as np

    from deepgap.core.stats import bootstrap_ci, hierarchical_bootstrap_ci

    rng = np.random.default_rng(7)
    hier = naive = 0
    trials = 120
    for i in range(trials):
        groups = _two_level(rng, n_groups=6, n_per=60, sd_between=1.0, sd_within=1.0)
        lo, hi = hierarchical_bootstrap_ci(groups, n_resamples=400, seed=i)
        hier += lo <= 5.0 <= hi
        lo, hi = bootstrap_ci(np.concatenate(groups), n_resamples=400)
        naive += lo <= 5.0 <= hi
    assert hier / trials >= 0.8, hier / trials
    assert naive / trials <= 0.5, naive / trials


def test_hierarchical_bootstrap_one_group_and_degenerate_inputs():
    import numpy as np

    from deepgap.core.stats import bootstrap_ci, hierarchical_bootstrap_ci

    x = np.random.default_rng(1).normal(3.0, 0.1, 200)
    assert hierarchical_bootstrap_ci([x]) == bootstrap_ci(x, n_resamples=1000)
    lo, hi = hierarchical_bootstrap_ci([x, x + 1.0])  # two processes a whole unit apart: a wide interval
    assert lo < 3.2 and hi > 3.8
    assert all(v != v for v in hierarchical_bootstrap_ci([[], [float("nan")]]))
