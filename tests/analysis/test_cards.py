"""Card-to-card spread (issue 34): the three-level bootstrap, and intervals that speak for the GPU type.

A synthetic store: platform "Fixture GPU H" on four cards (GPU UUIDs in each run's fingerprint) whose
medians differ by up to 8%, each card measured in two processes (sweeps) of a few percent spread inside;
its batch-32 configuration on one card only. "Fixture GPU B" is one card.
"""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_store import make_result

from deepgap.analysis import aggregate, prepare
from deepgap.analysis.cards import Spread, platform_spread, widen_interval
from deepgap.analysis.compare import compare
from deepgap.core.records import ConfigSpec
from deepgap.core.stats import card_bootstrap_ci, hierarchical_bootstrap_ci
from deepgap.store import Store

CARD_SLOWDOWN = [1.00, 1.03, 1.05, 1.08]  # four H cards: median latency × this
X = ("resnet50", 256, 0.008)  # model, batch, median latency (s) on card 0: measured on every card
Y = ("resnet50", 32, 0.002)  # measured on card 0 only


def _three_level(rng, cards=6, procs=6, n=20, sd_card=1.0, sd_proc=0.3, sd_within=0.3, mu=5.0):
    return [
        [mu + c + rng.normal(0, sd_proc) + rng.normal(0, sd_within, n) for _ in range(procs)]
        for c in rng.normal(0, sd_card, cards)
    ]


def test_three_level_bootstrap_covers_across_cards_where_two_levels_do_not():
    """Known answer: cards that differ more than their processes; the true median of the type is ``mu``.

    The three-level interval should hold it in most datasets; the two-level one over the same processes
    (cards ignored) treats 36 processes of 6 cards as 36 independent draws and misses it in about 40%.
    """
    rng = np.random.default_rng(11)
    three = two = 0
    trials = 50
    for i in range(trials):
        data = _three_level(rng)
        lo, hi = card_bootstrap_ci(data, n_resamples=300, seed=i)
        three += lo <= 5.0 <= hi
        lo, hi = hierarchical_bootstrap_ci([p for card in data for p in card], n_resamples=300, seed=i)
        two += lo <= 5.0 <= hi
    assert three / trials >= 0.8, three / trials
    assert two / trials <= 0.7, two / trials
    x = np.random.default_rng(1).normal(3.0, 0.1, 200)
    lo, hi = card_bootstrap_ci([[x]])
    assert lo < 3.0 < hi and all(v != v for v in card_bootstrap_ci([[[]], [[float("nan")]]]))


def _run(store, name, uuid, specs):
    env = {"device_name": name, "device": "cuda", "host": "fixture-host", "gpu_uuid": uuid}
    run = store.begin_run({"device": "cuda"}, "deepgap run (fixture)", env, "0.1.0")
    for spec, lat in specs:
        store.record(run, make_result(spec, lat, shift=spec.sweep))
    store.finish_run(run)


def _spec(cfg, sweep=0):
    return ConfigSpec(cfg[0], "eager", "fp16", cfg[1], "cuda", sweep=sweep)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cards") / "cards.sqlite")
    s = Store(path)
    for i, slow in enumerate(CARD_SLOWDOWN):
        specs = [(_spec(X, sw), X[2] * slow * (1 + 0.004 * sw)) for sw in range(2)]
        if i == 0:
            specs += [(_spec(Y, sw), Y[2] * (1 + 0.004 * sw)) for sw in range(2)]
        _run(s, "Fixture GPU H", f"GPU-card-{i}", specs)
    _run(
        s,
        "Fixture GPU B",
        "GPU-b-0",
        [(_spec(c, sw), c[2] * 1.3 * (1 + 0.004 * sw)) for c in (X, Y) for sw in range(2)],
    )
    s.close()
    s = Store(path, readonly=True)
    yield s
    s.close()


def _row(agg, platform, batch):
    return agg[(agg["platform"] == platform) & (agg["batch_size"] == batch)].iloc[0]


def test_store_and_aggregate_know_the_cards(store):
    df = prepare(store.results_frame())
    assert sorted(set(df["card"])) == ["GPU-b-0", "GPU-card-0", "GPU-card-1", "GPU-card-2", "GPU-card-3"]
    spreads = platform_spread(df)
    assert set(spreads) == {"Fixture GPU H"} and spreads["Fixture GPU H"].n_cards == 4
    tps = [1 / s for s in CARD_SLOWDOWN]
    assert spreads["Fixture GPU H"].rel_sd == pytest.approx(np.std(tps, ddof=1) / np.mean(tps), rel=0.05)
    agg = aggregate(df, samples=store.samples)
    x = _row(agg, "Fixture GPU H", X[1])
    assert x["n_cards"] == 4 and x["ci_method"].startswith(
        "three-level bootstrap over 4 cards, then 8 processes"
    )
    assert x["throughput_ci_low_ips"] < X[1] / (X[2] * 1.05) and x["throughput_ci_high_ips"] > X[1] / (
        X[2] * 1.02
    )
    y = _row(agg, "Fixture GPU H", Y[1])  # one card of a type with a known spread: widened
    assert y["n_cards"] == 1 and "widened by the card-to-card spread" in y["ci_method"]
    one = aggregate(df.assign(card=""), samples=store.samples)  # the same rows, cards unknown
    y1 = _row(one, "Fixture GPU H", Y[1])
    assert "card" not in y1["ci_method"]
    width = y["throughput_ci_high_ips"] - y["throughput_ci_low_ips"]
    assert width > 3 * (y1["throughput_ci_high_ips"] - y1["throughput_ci_low_ips"])
    b = _row(agg, "Fixture GPU B", Y[1])  # a one-card platform: nothing to widen by
    assert "card" not in b["ci_method"]


def test_compare_widens_by_the_card_spread(store):
    from deepgap.report.page import pooled_samples_fn

    df = prepare(store.results_frame())
    fn = pooled_samples_fn(store)
    agg = aggregate(df, samples=store.samples)
    h, b = agg[agg["platform"] == "Fixture GPU H"], agg[agg["platform"] == "Fixture GPU B"]
    matched, _ = compare(h, b, fn, fn, n_resamples=300)
    row = matched[matched["batch_size"] == Y[1]].iloc[0]
    assert "widened by the card-to-card spread" in row["ci_method"] and "(A)" in row["ci_method"]
    plain, _ = compare(h.drop(columns="card_spread_rel"), b, fn, fn, n_resamples=300)
    p = plain[plain["batch_size"] == Y[1]].iloc[0]
    assert (row["speedup_ci_high"] - row["speedup_ci_low"]) > 3 * (p["speedup_ci_high"] - p["speedup_ci_low"])
    x = matched[matched["batch_size"] == X[1]].iloc[0]  # four cards of H against one of B
    assert x["ci_method"] == "three-level bootstrap (cards, processes, samples): 4 card(s) vs 1 card(s)"
    ratios = [1.3 / s for s in CARD_SLOWDOWN]  # each H card's speed over B's
    assert x["speedup_ci_low"] < ratios[2] and x["speedup_ci_high"] > ratios[0] * 0.99
    pooled, _ = compare(
        h.assign(card_result_ids=[[]] * len(h)).drop(columns="card_spread_rel"), b, fn, fn, n_resamples=300
    )
    px = pooled[pooled["batch_size"] == X[1]].iloc[0]
    assert px["ci_method"].startswith("bootstrap of pooled")
    assert (x["speedup_ci_high"] - x["speedup_ci_low"]) > 2 * (px["speedup_ci_high"] - px["speedup_ci_low"])


def test_widen_interval_and_plan_devices():
    assert widen_interval(100.0, 99.0, 101.0, []) == (99.0, 101.0)
    lo, hi = widen_interval(100.0, 99.0, 101.0, [0.02])
    assert lo < 96.5 and hi > 103.5
    from deepgap.serving.capacity.planner import PlanRow, widen_by_cards

    rows = [
        PlanRow("Fixture GPU H", "cfg", "bs32", 1000.0, 10, None, None),
        PlanRow("Fixture GPU B", "cfg", "bs32", 1000.0, 10, None, None),
    ]
    widen_by_cards(rows, {"Fixture GPU H": Spread("Fixture GPU H", 0.05, 3, 4)}, 10_000)
    assert rows[0].devices_high == 12 and "up to 12 devices" in rows[0].note and "4 cards" in rows[0].note
    assert rows[1].devices_high is None and rows[1].note == ""


def test_report_section_shows_the_spread_between_cards(store):
    from deepgap.analysis.cards_section import SECTION, TABLE_SPECS, build
    from deepgap.render.formatting import html_table
    from deepgap.render.sections import ReportContext
    from deepgap.report.sections import registered

    assert SECTION in registered()
    df = prepare(store.results_frame())
    parts = build(ReportContext(store.path, None, False, [], df, aggregate(df)))
    rows = parts.tables["card_spread"]
    assert list(rows["platform"]) == ["Fixture GPU H"] and rows["n_cards"].iloc[0] == 4
    assert rows["spread"].iloc[0] == pytest.approx(0.08, rel=0.02)  # fastest card / slowest card − 1
    html = str(html_table("card_spread", rows, TABLE_SPECS["card_spread"]))
    assert "8.0%" in html and "Card to card" in html
    assert parts.tables["card_spread_platforms"]["n_cards"].iloc[0] == 4
    one = df[df["platform"] == "Fixture GPU B"]
    assert build(ReportContext(store.path, None, False, [], one, aggregate(one))).tables == {}
