"""benchmarks/compile_sm90.py's case table: every launched Triton kernel has a case, and every case launches.

Nothing is compiled (that takes minutes; the script is run by hand before a device call): the cases' launches
are only captured (deepgap's launch code on meta tensors, Triton's cache hook), a few seconds.
"""

from __future__ import annotations

import pytest
from repo_paths import imported_benchmark


@pytest.fixture(scope="module")
def script():
    """benchmarks/compile_sm90.py imported (its case table, `sm90_cases`, beside it)."""
    yield from imported_benchmark("compile_sm90")


def test_every_launched_kernel_has_a_case_and_every_case_launches(script):
    launches = script.capture()
    assert [(ln.family, ln.case, ln.error) for ln in launches if ln.error] == []
    captured = {ln.kernel for ln in launches}
    launched = script.launched_kernels()
    assert "deepgap.measure.llm_attention:decode_attention_kernel" in launched
    assert (
        "deepgap.measure.llm_attention:attend_rows" not in launched
    )  # a helper: compiled through its kernels
    assert launched - captured == set(), "a launched kernel without a case in benchmarks/sm90_cases.py"
    assert captured - launched == set(), "the scan missed a kernel that a case launches"


def test_the_scan_counts_what_code_outside_jit_functions_names(script, tmp_path):
    (tmp_path / "k.py").write_text(
        "import triton\n"
        "@triton.jit\ndef helper(x):\n    return x\n"
        "@triton.jit(do_not_specialize=['n'])\ndef kernel(x, n):\n    helper(x)\n"
        "def launch(x):\n    launcher(kernel, x)\n"
    )
    (tmp_path / "other.py").write_text(
        "from deepgap.k import helper\nhelper = None\nprefetch = 1\nprint(prefetch)\n"
    )
    assert script.launched_kernels(tmp_path) == {"deepgap.k:kernel"}


def test_a_case_whose_launch_failed_shows_whatever_only_asks(script, monkeypatch, capsys, tmp_path):
    """--only filters kernels by name; a case that raised names none, and it still shows (and fails the run)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # main sets it where unset; restored after
    failed = script.Launch("split-k", "l4.0.conv2 b1 fp8 spread", error="ValueError: runs on a GPU only")
    monkeypatch.setattr(script, "capture", lambda: [failed])
    monkeypatch.setattr(script, "launched_kernels", lambda: set())
    assert script.main(["--only", "conv_gemm"]) == 1
    out = capsys.readouterr().out
    assert "FAIL -" in out and "split-k: l4.0.conv2 b1 fp8 spread" in out and "1 failed" in out
