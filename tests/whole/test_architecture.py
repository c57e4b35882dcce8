"""The architecture's rules, checked: the import contracts in pyproject.toml (layers, no cycles between
siblings) through import-linter, and no module reaching into another package's private names.

A new private import across packages fails here with the file, the line and the name; the fix is to make the
name public (drop the underscore, document it) where it is defined, not to add it to the allow-list.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from repo_paths import ROOT

SRC = ROOT / "src"

# Private names used across packages today, each with the reason it is still here. Nothing else may join.
ALLOWED: set[tuple[str, str, str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package(module: str, is_package: bool) -> str:
    """A module's package for this rule: its parent subpackage; a top-level module is a package of its own."""
    if is_package:
        return module
    parent = module.rpartition(".")[0]
    return module if parent == "deepgap" else parent


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_package(module: str) -> bool:
    return (SRC / Path(*module.split("."))).is_dir()


def _is_module(name: str) -> bool:
    return _is_package(name) or (SRC / Path(*name.split("."))).with_suffix(".py").exists()


def _modules() -> list[tuple[str, bool, Path]]:
    return [(_module_name(p), p.name == "__init__.py", p) for p in sorted((SRC / "deepgap").rglob("*.py"))]


def private_imports() -> list[tuple[str, str, str, int]]:
    """(importer, module, name, line) for every private name of another package that a module uses.

    Three forms: ``from deepgap.x import _y``; ``import deepgap.x as m`` (or ``from deepgap import x``) then
    ``m._y``; and a class whose base comes from another package calling ``self._y`` that it does not define.
    """
    found = []
    for module, is_package, path in _modules():
        tree = ast.parse(path.read_text(), str(path))
        mine = _package(module, is_package)
        aliases: dict[str, str] = {}  # local name -> deepgap module
        bases: dict[str, str] = {}  # local name of an imported class -> its module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                src = _resolve(module, is_package, node)
                if not src.startswith("deepgap"):
                    continue
                for a in node.names:
                    full = f"{src}.{a.name}"
                    if _is_module(full):
                        aliases[a.asname or a.name] = full
                    elif _private(a.name) and _package(src, _is_package(src)) != mine:
                        found.append((module, src, a.name, node.lineno))
                    else:
                        bases[a.asname or a.name] = src
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("deepgap.") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
                target = aliases.get(node.value.id)
                if target and _package(target, _is_package(target)) != mine:
                    found.append((module, target, node.attr, node.lineno))
            if isinstance(node, ast.ClassDef):
                foreign = [
                    bases[b.id]
                    for b in node.bases
                    if isinstance(b, ast.Name) and b.id in bases and _package(bases[b.id], False) != mine
                ]
                if not foreign:
                    continue
                defs = (ast.FunctionDef, ast.AsyncFunctionDef)
                own = {n.name for n in ast.walk(node) if isinstance(n, defs)}
                own |= {
                    t.attr
                    for n in ast.walk(node)
                    if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    if isinstance(t, ast.Attribute)
                }
                for n in ast.walk(node):
                    if (
                        isinstance(n, ast.Attribute)
                        and getattr(n.value, "id", None) == "self"
                        and _private(n.attr)
                        and n.attr not in own
                    ):
                        found.append((module, foreign[0], n.attr, n.lineno))
    return found


def test_no_private_names_imported_across_packages():
    found = private_imports()
    bad = [f"{m}:{line} uses {src}.{name}" for m, src, name, line in found if (m, src, name) not in ALLOWED]
    assert not bad, "private names used across packages (make them public where defined):\n" + "\n".join(bad)
    stale = ALLOWED - {(m, src, name) for m, src, name, _ in found}
    assert not stale, f"allow-list entries no longer needed, remove them: {sorted(stale)}"


def test_the_private_import_scan_finds_each_form(tmp_path, monkeypatch):
    """The scan itself can fail: a fake package with one offence of each form is caught."""
    pkg = tmp_path / "deepgap"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "inner.py").write_text("def _ok():\n    pass\n")
    (pkg / "a" / "sibling.py").write_text("from deepgap.a.inner import _ok\n")  # same package: allowed
    (pkg / "base.py").write_text(
        "class Base:\n    def _recv(self):\n        pass\n\ndef _hidden():\n    pass\n"
    )
    (pkg / "user.py").write_text(
        "from deepgap.base import _hidden, Base\nimport deepgap.base as b\nfrom deepgap import base\n"
        "b._hidden()\nbase._hidden()\n"
        "class Sub(Base):\n    def run(self):\n        return self._recv(), self._mine\n"
        "    def __init__(self):\n        self._mine = 1\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    got = sorted((m, src, name) for m, src, name, _ in private_imports())
    hidden, recv = ("deepgap.user", "deepgap.base", "_hidden"), ("deepgap.user", "deepgap.base", "_recv")
    assert got == [hidden] * 3 + [recv]


def _lint_imports() -> list[str]:
    exe = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    assert exe, "lint-imports not found: install the test extra (pip install -e '.[test]')"
    return [exe]


def test_import_contracts_are_kept():
    """``lint-imports`` with the repository's pyproject.toml: layers and acyclic siblings (exit 0)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(
        [*_lint_imports(), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout


def _contracts() -> list[dict]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_no_import_exceptions():
    """Every contract's ``ignore_imports`` is empty: no upward, cyclic or worker import is tolerated, lazy or not."""
    contracts = _contracts()
    assert {c["id"] for c in contracts} == {"layers", "serving-layers", "acyclic", "worker-modules"}
    exceptions = {c["id"]: c.get("ignore_imports", []) for c in contracts}
    assert exceptions == {"layers": [], "serving-layers": [], "acyclic": [], "worker-modules": []}, exceptions


def test_every_module_with_a_worker_handler_is_a_forbidden_worker_module():
    """A module that registers a handler (``@handles``) runs in the worker: the parent may never import it.

    Why: the forbidden contract enforces "the parent never touches the GPU" only for the modules it lists;
    a new feature's handlers in an unlisted module would slip past it. Each listed module also imports
    torch at the top (it is never loaded in the parent, so it need not be light).
    """
    listed = {c["id"]: c for c in _contracts()}["worker-modules"]["forbidden_modules"]
    registering = set()
    for path in SRC.joinpath("deepgap").rglob("*.py"):
        text = path.read_text()
        if "@handles(" in text and "def handles(" not in text:
            registering.add(".".join(path.relative_to(SRC).with_suffix("").parts))
    assert registering, "no module registers a worker handler: the scan is broken"
    assert registering <= set(listed), sorted(registering - set(listed))
    for name in listed:
        path = SRC.joinpath(*name.split(".")).with_suffix(".py")
        assert path.exists(), name
        imports_torch = any(line == "import torch" for line in path.read_text().splitlines())
        uses_worker = (
            "from deepgap.measure.worker import" in path.read_text() or name == "deepgap.measure.worker"
        )
        assert imports_torch or uses_worker, (
            f"{name}: a worker module imports torch (or the worker) at the top"
        )


def test_a_parent_import_of_a_worker_module_is_reported(tmp_path):
    """The forbidden contract breaks when a parent module imports a worker module, directly or not."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    contract = {c["id"]: c for c in _contracts()}["worker-modules"]
    assert "deepgap.drive" in contract["source_modules"] and "deepgap.commands" in contract["source_modules"]
    pkg = tmp_path / "src" / "deepgap"
    shutil.copytree(SRC / "deepgap", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    runner = pkg / "drive" / "runner.py"
    runner.write_text(
        runner.read_text() + "\n\ndef _bad():\n    from deepgap.measure import configuration  # noqa\n"
    )
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text((ROOT / "pyproject.toml").read_text())
    assert tomllib.loads(cfg.read_text())["tool"]["importlinter"]["root_package"] == "deepgap"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    p = subprocess.run(
        [*_lint_imports(), "--no-cache", "--no-logo", "--contract", "worker-modules", str(cfg)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert p.returncode != 0 and "deepgap.drive.runner -> deepgap.measure.configuration" in p.stdout, (
        p.stdout[-3000:]
    )


def test_a_broken_layer_is_reported(tmp_path):
    """The linter fails on an upward import: the layers contract with store above cli must break."""
    cfg = tmp_path / "contracts.toml"
    cfg.write_text(
        '[tool.importlinter]\nroot_package = "deepgap"\n\n[[tool.importlinter.contracts]]\n'
        'name = "upside down"\ntype = "layers"\ncontainers = ["deepgap"]\n'
        'layers = ["store", "commands"]\n'
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(
        [*_lint_imports(), "--no-cache", "--no-logo", str(cfg)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert p.returncode == 1 and "BROKEN" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]


def test_importing_the_package_does_not_import_the_run_machinery():
    """``import deepgap`` (which every module's import runs first) loads no deepgap module; the public
    names still resolve, from their own modules."""
    code = (
        "import sys, deepgap; assert sorted(m for m in sys.modules if m.startswith('deepgap.')) "
        "== ['deepgap.core', 'deepgap.core.version'], "
        "sorted(m for m in sys.modules if m.startswith('deepgap.'))\n"
        "from deepgap import ConfigSpec, Results, SweepSpec, run\n"
        "assert run.__module__ == 'deepgap.api' and SweepSpec.__module__ == 'deepgap.drive.config'\n"
        "assert set(deepgap.__all__) <= set(dir(deepgap))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]


def test_only_nvml_access_imports_nvml():
    """NVML is imported in one module (`deepgap.core.nvml_access`): one UUID spelling, one reason when missing."""
    found = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            if any(n.split(".")[0] == "pynvml" for n in names):
                found.append(_module_name(path))
    assert found == ["deepgap.core.nvml_access"], found
