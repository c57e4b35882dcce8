"""`deepgap recommend`: known answers, flagged never chosen, the no-solution case with its closest miss."""

import json

import pytest
from fixtures_store import GiB, build_store

from deepgap.analysis import aggregate, prepare
from deepgap.analysis.recommend import parse_bytes, parse_duration_s, recommend
from deepgap.cli import main
from deepgap.core.errors import UsageError
from deepgap.store import Store


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("rec") / "fx.sqlite")
    build_store(path)
    s = Store(path, readonly=True)
    agg = aggregate(prepare(s.results_frame()))
    s.close()
    return path, agg


def _by_model(recs):
    return {r.model: r for r in recs}


def test_best_throughput_under_slo_never_flagged(fx):
    recs = _by_model(recommend(fx[1], "throughput", slo_p99_s=0.010))
    c = recs["resnet18"].choice
    # int8 bs128 is faster (21,333/s, P99 6.3 ms) but has wrong outputs: int8 bs32 wins
    assert (c["platform"], c["precision"], c["batch_size"]) == ("Fixture GPU A", "int8", 32)
    assert c["latency_p99_s"] <= 0.010 and "int8 bs32" in c["configuration"]
    assert recs["resnet18"].excluded == {"flagged": 1}
    assert recs["resnet50"].choice["precision"] == "fp16" and recs["resnet50"].choice["batch_size"] == 8
    # without constraints the flagged configuration still is not chosen
    top = _by_model(recommend(fx[1], "throughput"))["resnet18"].choice
    assert (top["precision"], top["batch_size"]) == ("int8", 32)


def test_memory_cap_and_objectives(fx):
    # resnet50 fp16 bs128 uses 0.6 GiB + 128·40 MiB = 5.6 GiB (device-wide); a 4 GiB cap leaves fp16 bs32
    r = _by_model(recommend(fx[1], "throughput", max_memory_bytes=4 * GiB))["resnet50"]
    assert (r.choice["precision"], r.choice["batch_size"]) == ("fp16", 32)
    assert r.choice["memory_metric"].startswith("device-wide")
    lat = _by_model(recommend(fx[1], "latency"))["resnet18"].choice
    assert (lat["precision"], lat["batch_size"]) == ("int8", 1)
    j = _by_model(recommend(fx[1], "joules"))["resnet18"]
    assert j.choice["platform"] == "Fixture GPU A" and j.excluded["no energy telemetry"] == 6  # the CPU rows


def test_no_solution_names_the_closest_miss(fx):
    r = _by_model(recommend(fx[1], "throughput", slo_p99_s=0.0005))["resnet18"]
    assert r.choice is None and r.reason == "none meets the constraint"
    assert (r.closest_miss["precision"], r.closest_miss["batch_size"]) == ("int8", 1)
    # 63 calls: too few for a P99, so the tail checked is their maximum, and the miss says so
    assert "tail (max of 63 calls)" in r.misses[0] and "SLO 0.5 ms" in r.misses[0]


def test_parsers():
    assert parse_duration_s("10ms") == pytest.approx(0.01)
    assert parse_duration_s("250 us") == pytest.approx(250e-6) and parse_duration_s("1.5s") == 1.5
    assert (
        parse_bytes("8GiB") == 8 * 2**30
        and parse_bytes("8GB") == 8 * 10**9
        and parse_bytes("512M") == 512 * 2**20
    )
    for bad in ["-3ms", "0ms", "10", "ten ms", "3 parsecs", "90000s", "1e30s"]:  # past a day: a typo
        with pytest.raises(UsageError):
            parse_duration_s(bad)
    assert parse_duration_s("86400s") == 86400.0
    for bad in ["8", "-1GiB", "0GB", "lots"]:
        with pytest.raises(UsageError):
            parse_bytes(bad)


def test_cli_recommend_exit_codes_and_evidence(fx, capsys):
    assert main(["recommend", fx[0], "--slo-p99", "10ms", "--max-memory", "8GiB"]) == 0
    out = capsys.readouterr().out
    assert "resnet18 eager int8 bs32" in out and "evidence:" in out and "excluded: 1 flagged" in out
    assert main(["recommend", fx[0], "--slo-p99", "0.5ms", "--model", "resnet18"]) == 1
    out = capsys.readouterr().out
    assert "none meets the constraint" in out and "closest miss: resnet18 eager int8 bs1" in out
    assert main(["recommend", fx[0], "--json", "--objective", "latency", "--precision", "fp32"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {d["model"] for d in data} == {"resnet18", "resnet50"}
    assert all(d["choice"]["precision"] == "fp32" for d in data)


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--slo-p99=-3ms"], "not a positive duration"),
        (["--max-memory", "lots"], "not a positive size"),
        (["--objective", "cost"], "is unknown"),
        (["--run", "20990101-000000-ffffff"], "no run"),
    ],
)
def test_cli_recommend_bad_input(fx, extra, match, capsys):
    assert main(["recommend", fx[0], *extra]) == 2
    assert match in capsys.readouterr().err


def test_cli_recommend_missing_store(tmp_path, capsys):
    assert main(["recommend", str(tmp_path / "none.sqlite")]) == 2
    assert "does not exist" in capsys.readouterr().err and list(tmp_path.iterdir()) == []
