"""benchmarks/device_lib.sh's ``bundle``: the device tool returns at most 8 files from $OUT, so a recipe that
leaves more packs them into one archive at its exit (session 25 lost two result files to that limit)."""

import shutil
import subprocess
import tarfile

from repo_paths import BENCHMARKS


def _run(script: str, out) -> str:
    """``script`` in a folder holding only benchmarks/device_lib.sh (no .whl/ to install), $OUT = ``out``."""
    repo = out.parent / "repo"
    (repo / "benchmarks").mkdir(parents=True, exist_ok=True)
    shutil.copy(BENCHMARKS / "device_lib.sh", repo / "benchmarks")
    r = subprocess.run(["bash", "-c", script], cwd=repo, env={"OUT": str(out), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, check=True)  # fmt: skip
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
