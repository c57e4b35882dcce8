"""benchmarks/device_lib.sh's ``bundle``: the device tool returns at most 8 files from $OUT, so a recipe that
leaves more packs them into one archive at its exit (session 25 lost two result files to that limit). And its
compile caches: saved into $OUT in parts, joined here, carried back and restored by the next call."""

import shutil
import subprocess
import tarfile

from repo_paths import BENCHMARKS


def _run(script: str, out, **env: str) -> str:
    """``script`` in a folder holding only benchmarks/device_lib.sh (no .whl/ to install), $OUT = ``out``."""
    repo = out.parent / "repo"
    (repo / "benchmarks").mkdir(parents=True, exist_ok=True)
    shutil.copy(BENCHMARKS / "device_lib.sh", repo / "benchmarks")
    env = {"OUT": str(out), "PATH": "/usr/bin:/bin", "COMPILE_CACHE": str(out.parent / "cc"), **env}
    r = subprocess.run(["bash", "-c", script], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return r.stdout


def test_eight_files_come_back_as_they_are(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for i in range(8):
        (out / f"f{i}.txt").write_text(str(i))
    _run("source benchmarks/device_lib.sh", out)
    assert sorted(p.name for p in out.iterdir()) == [f"f{i}.txt" for i in range(8)]


def test_more_files_leave_one_archive_per_exit_and_lose_none(tmp_path):
    tmp_path = tmp_path / "out"
    (tmp_path / "sub").mkdir(parents=True)
    (tmp_path / "sub" / "answer.csv").write_text("a")
    script = (
        "source benchmarks/device_lib.sh; for i in $(seq 1 9); do echo $i > $OUT/f$i.txt; done; "
        # a recipe that runs another: the inner one's exit packs what is there, the outer's the rest
        "bash -c 'source benchmarks/device_lib.sh'; for i in $(seq 1 9); do echo $i > $OUT/g$i.txt; done"
    )
    said = _run(script, tmp_path)
    assert "packed into out-1.tar.gz" in said and "packed into out-2.tar.gz" in said
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["out-1.tar.gz", "out-2.tar.gz"]
    with tarfile.open(tmp_path / "out-1.tar.gz") as t1, tarfile.open(tmp_path / "out-2.tar.gz") as t2:
        names = {
            n.removeprefix("./") for n in t1.getnames() + t2.getnames() if not n.endswith("/") and n != "."
        }
    assert names == {
        "sub/answer.csv",
        *(f"f{i}.txt" for i in range(1, 10)),
        *(f"g{i}.txt" for i in range(1, 10)),
    }


def test_compile_caches_go_out_in_parts_and_come_back_with_a_carried_archive(tmp_path):
    out, cc = tmp_path / "out", tmp_path / "cc"
    out.mkdir()
    (cc / "triton" / "ab").mkdir(parents=True)
    (cc / "triton" / "ab" / "k.cubin").write_bytes(bytes(range(256)) * 40)
    (cc / "inductor" / "fx").mkdir(parents=True)
    (cc / "inductor" / "fx" / "g.py").write_text("graph")
    said = _run(
        'source benchmarks/device_lib.sh; echo "$TRITON_CACHE_DIR $TORCHINDUCTOR_CACHE_DIR"; cache_save', out
    )
    assert f"{cc}/triton {cc}/inductor" in said and "saved as 1 part(s)" in said
    parts = sorted(out.glob("out-compile-cache.txz.*"))
    assert [p.name for p in parts] == ["out-compile-cache.txz.00"]
    # here: the parts joined into the ignored folder the next call carries
    carry = tmp_path / "repo" / ".carry"
    carry.mkdir()
    (carry / "compile-cache.tar.xz").write_bytes(b"".join(p.read_bytes() for p in parts))
    fresh = tmp_path / "cc2"
    said = _run("source benchmarks/device_lib.sh; source benchmarks/device_lib.sh; echo $TRITON_CACHE_DIR", out,
                COMPILE_CACHE=str(fresh))  # fmt: skip
    assert said.count("compile caches restored") == 1 and f"{fresh}/triton" in said  # once a machine
    assert (fresh / "triton" / "ab" / "k.cubin").read_bytes() == bytes(range(256)) * 40
    assert (fresh / "inductor" / "fx" / "g.py").read_text() == "graph"


def test_a_bundle_leaves_the_saved_cache_parts_as_they_are(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for i in range(9):
        (out / f"f{i}.txt").write_text(str(i))
    (out / "out-compile-cache.txz.00").write_bytes(b"part")
    _run("source benchmarks/device_lib.sh", out)
    assert sorted(p.name for p in out.iterdir()) == ["out-1.tar.gz", "out-compile-cache.txz.00"]
