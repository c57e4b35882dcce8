"""The SQLite store: round trip, refusal of foreign/newer files, concurrent writers."""

import multiprocessing as mp
import sqlite3

import numpy as np
import pytest

from deepgap.core.errors import StoreError
from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.core.result_details import Correctness, ResultDetails
from deepgap.core.stats import summarize
from deepgap.store import SCHEMA_VERSION, Store, check_path


def make_result(bs=1, status=Status.OK, model="tinycnn"):
    spec = ConfigSpec(model=model, engine="eager", precision="fp32", batch_size=bs, device="cpu")
    if status != Status.OK:
        return Result(spec=spec, status=status, reason="why")
    samples = [[0.01, 0.011, 0.012], [0.010, 0.013, 0.011]]
    lat = summarize(np.concatenate(samples))
    return Result(
        spec=spec,
        status=status,
        latency=lat,
        throughput_ips=bs / lat.median_s,
        samples_s=samples,
        n_repeats=2,
        details=ResultDetails(correctness=Correctness(flagged=False)),
    )


def test_round_trip(tmp_path):
    s = Store(str(tmp_path / "s.sqlite"))
    run = s.begin_run({"models": ["tinycnn"]}, "deepgap run", {"device_name": "cpu x"}, "0.1")
    rid = s.record(run, make_result(4), telemetry=[("measure", 1.0, {"power_w": 10.0})])
    s.record(run, make_result(8, Status.OOM))
    assert s.record(run, make_result(4)) is None  # same configuration twice: no duplicate
    s.finish_run(run)
    df = s.results_frame()
    assert list(df["batch_size"]) == [4, 8] and list(df["status"]) == ["ok", "oom"]
    assert df.loc[0, "n_samples"] == 6
    assert df.loc[0, "device_name"] == "cpu x" and df.loc[0, "extra"].correctness.flagged is False
    assert [list(a) for a in s.samples(rid)] == [[0.01, 0.011, 0.012], [0.010, 0.013, 0.011]]
    assert s.telemetry_frame(run)["power_w"].tolist() == [10.0]
    assert s.runs()[0]["status"] == "finished"
    assert ConfigSpec.from_key(df.loc[0, "config_key"]).batch_size == 4


@pytest.mark.parametrize(
    "content, match",
    [
        (b"hello, not a database at all", "not a deepgap store"),
        (b"SQLite format 3\x00" + b"\x00" * 200, "corrupt|not a deepgap"),
    ],
)
def test_refuses_non_store_files(tmp_path, content, match):
    p = tmp_path / "x.sqlite"
    p.write_bytes(content)
    with pytest.raises(StoreError, match=match):
        Store(str(p))
    assert p.read_bytes() == content  # untouched


def test_refuses_foreign_sqlite_and_newer_schema(tmp_path):
    foreign = tmp_path / "foreign.sqlite"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE t(x)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="not a deepgap store"):
        Store(str(foreign))
    newer = tmp_path / "newer.sqlite"
    Store(str(newer)).close()
    con = sqlite3.connect(newer)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="newer"):
        Store(str(newer))


def test_check_path_writes_nothing(tmp_path):
    target = tmp_path / "a" / "b" / "s.sqlite"
    check_path(str(target))
    assert not (tmp_path / "a").exists()
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if not __import__("os").access(ro, __import__("os").W_OK):  # root can write anywhere
            with pytest.raises(StoreError, match="not writable"):
                check_path(str(ro / "s.sqlite"))
    finally:
        ro.chmod(0o700)
    with pytest.raises(StoreError, match="directory"):
        check_path(str(tmp_path))


def _writer(path, n, tag):
    s = Store(path)
    run = s.begin_run({"tag": tag}, "w", {}, "0")
    for bs in range(1, n + 1):
        s.record(run, make_result(bs, model=f"m{tag}"))
    s.finish_run(run)


def test_two_concurrent_writers(tmp_path):
    path = str(tmp_path / "c.sqlite")
    Store(path).close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, 25, t)) for t in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    s = Store(path, readonly=True)
    df = s.results_frame()
    assert len(df) == 50 and df.groupby("run_id").size().tolist() == [25, 25]
    assert s.con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_second_store_on_an_open_file_keeps_the_first_ones_writes_visible_elsewhere(tmp_path):
    """Closing a second descriptor of the file must not drop this process's SQLite locks (store/held.py)."""
    import subprocess
    import sys

    path = str(tmp_path / "s.sqlite")
    writer = Store(path)
    first = writer.begin_run({}, "test", {}, "0")
    Store(path, readonly=True).close()  # its header check used to open and close the file directly
    count = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "print(c.execute('SELECT count(*) FROM runs').fetchone()[0]); c.close()"
    )

    def seen_elsewhere() -> int:
        out = subprocess.run([sys.executable, "-c", count, path], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return int(out.stdout)

    assert seen_elsewhere() == 1  # the other process must not checkpoint away the write-ahead log
    writer.begin_run({}, "test", {}, "0")
    assert seen_elsewhere() == 2
    writer.close()
    assert [r["run_id"] for r in Store(path, readonly=True).runs()][:1] == [first]
