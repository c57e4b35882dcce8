"""Issue 49, items 3 and 4: a platform is a host and its device; comparisons pair like device kinds.

Why one file: merging two GPU VMs' stores pooled both hosts' CPUs (one generic name, one host name) into
one platform, `compare A B` set each GPU against the other store's CPU, and `compare --paper` set a CPU
against the paper's GPUs without saying so; each test fails on the code before the issue. Two small
stores (a GPU and its host-CPU part, as a default GPU run writes them) through `Store.record`, merged by
`deepgap merge`, read in this process.
"""

from __future__ import annotations

import json

import pytest
from clirun import deepgap_cli
from fixtures_store import configurations, make_result

from deepgap.analysis.host_cpu import host_cpu_lines
from deepgap.core.records import ConfigSpec
from deepgap.store import Store

CPU_PART = {"node_env": {"device_name": "Fixture CPU", "host": "vm", "device": "cpu"}}
GPU_MS = {"Fixture GPU A": 1.0, "Fixture GPU B": 2.0}  # resnet18 fp32 bs8, per batch
CPU_MS = {"Fixture GPU A": 100.0, "Fixture GPU B": 40.0}  # the same CPU name, hosts 2.5× apart


def _gpu_store(path: str, gpu: str) -> str:
    s = Store(path)
    env = {"device_name": gpu, "device": "cuda", "host": "vm", "cpu_model": "Fixture CPU"}
    run = s.begin_run({"device": "cuda"}, "deepgap run (fixture)", env, "0")
    spec = ConfigSpec(model="resnet18", engine="eager", precision="fp32", batch_size=8, device="cuda")
    s.record(run, make_result(spec, GPU_MS[gpu] / 1e3))
    cpu = ConfigSpec(
        model="resnet18", engine="eager", precision="fp32", batch_size=8, device="cpu", threads=4
    )
    s.record(run, make_result(cpu, CPU_MS[gpu] / 1e3, extra=CPU_PART))
    s.finish_run(run)
    s.close()
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> tuple[str, str, str]:
    d = tmp_path_factory.mktemp("platforms")
    a, b = _gpu_store(str(d / "a.sqlite"), "Fixture GPU A"), _gpu_store(str(d / "b.sqlite"), "Fixture GPU B")
    merged = str(d / "merged.sqlite")
    r = deepgap_cli("merge", a, b, "-o", merged)
    assert r.returncode == 0, r.stderr
    return a, b, merged


def test_merged_hosts_keep_their_cpus_apart(stores):
    """Two hosts' CPUs of one name are two platforms; each GPU's × host CPU is over its own host's.

    Before: one platform "Fixture CPU" pooled both, and each GPU's ratio was over the pool.
    """
    a, _, merged = stores
    agg = configurations(merged)
    cpus = sorted(agg.loc[agg["device"] == "cpu", "platform"])
    assert cpus == ["Fixture CPU (host of Fixture GPU A)", "Fixture CPU (host of Fixture GPU B)"]
    lines = {ln.platform: ln for ln in host_cpu_lines(agg)}
    assert lines["Fixture GPU A"].cpu_platform == "Fixture CPU (host of Fixture GPU A)"
    assert lines["Fixture GPU A"].throughput.value == pytest.approx(100.0, rel=1e-6)  # 100 ms / 1 ms
    assert lines["Fixture GPU B"].throughput.value == pytest.approx(20.0, rel=1e-6)  # 40 ms / 2 ms
    alone = {ln.platform: ln for ln in host_cpu_lines(configurations(a))}
    assert alone["Fixture GPU A"].cpu_platform == "Fixture CPU"  # one host: its plain name
    assert alone["Fixture GPU A"].throughput.value == pytest.approx(lines["Fixture GPU A"].throughput.value)


def test_compare_pairs_like_device_kinds(stores):
    """`compare A B` sets A's GPU against B's GPU and A's CPU against B's CPU, never a GPU against a CPU."""
    a, b, merged = stores
    r = deepgap_cli("compare", a, b, "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["best_batch"] + json.loads(r.stdout)["matched"]
    assert rows and all(row["device_a"] == row["device_b"] for row in rows)
    gpu = [row for row in json.loads(r.stdout)["best_batch"] if row["device_a"] == "cuda"]
    assert len(gpu) == 1 and gpu[0]["speedup"] == pytest.approx(2.0, rel=1e-6)
    r = deepgap_cli("compare", merged, a)  # two GPUs on side A: which pair is meant must be said
    assert r.returncode == 2 and "--platforms" in r.stderr and "holds 2 c" in r.stderr


def test_compare_paper_labels_each_pairing(stores):
    """Every row of `compare --paper` says what it sets against what; a CPU against a GPU says unlike kinds."""
    a, _, _ = stores
    r = deepgap_cli("compare", a, "--paper", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["paper"]
    assert rows and all(row["pairing"] for row in rows)
    kinds = {
        ("xeon" in row["paper_platform"].lower(), row["platform"] == "Fixture CPU"): row["pairing"]
        for row in rows
    }
    assert kinds.get((False, False)) == "GPU vs GPU"
    assert kinds.get((False, True), "").startswith("CPU vs GPU (unlike kinds")
    r = deepgap_cli("compare", a, "--paper")
    assert "pairing" in r.stdout and "unlike kinds" in r.stdout
