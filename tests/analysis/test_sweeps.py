"""A configuration measured in several processes: two-level CI, between-sweep spread, the spread warning."""

import numpy as np
import pandas as pd

from deepgap.analysis import sweeps


def _used(tps, cis):
    return pd.DataFrame(
        {
            "result_id": range(len(tps)),
            "batch_size": [8] * len(tps),
            "throughput_ips": tps,
            "throughput_ci_low_ips": [c[0] for c in cis],
            "throughput_ci_high_ips": [c[1] for c in cis],
        }
    )


def test_spread_flags_sweeps_whose_own_intervals_do_not_overlap():
    cv, values, disagree = sweeps.spread(_used([100.0, 110.0], [(99, 101), (108, 112)]))
    assert disagree and values == [100.0, 110.0] and abs(cv - np.std([100, 110], ddof=1) / 105) < 1e-12
    assert not sweeps.spread(_used([100.0, 101.0], [(98, 102), (99, 103)]))[2]
    cv, _, disagree = sweeps.spread(_used([100.0], [(99, 101)]))
    assert cv != cv and not disagree  # one measurement: no spread to speak of


def test_two_processes_apart_give_an_interval_that_spans_both():
    rng = np.random.default_rng(0)
    lat = {0: [0.010 + rng.normal(0, 1e-5, 500)], 1: [0.011 + rng.normal(0, 1e-5, 500)]}
    used = _used([800.0, 727.0], [(799, 801), (726, 728)])
    lo, hi, how = sweeps.throughput_ci(used, lambda rid: lat[rid])
    assert "hierarchical" in how and lo < 735 and hi > 795  # within-process CIs would be ±1 img/s
    assert sweeps.throughput_ci(used.iloc[:1], lambda rid: lat[rid]) is None  # needs two processes
