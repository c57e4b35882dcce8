"""The size rules of src/ (issue 48), checked so that growth is seen when it happens, not a session later.

Why: in two days the code once grew by a third, and files over 400 lines went from 4 to 13 before anyone
counted. The rules (ARCHITECTURE.md, docs/development.md): no file in src/ over 400 lines, no function
over 80 (from its ``def`` line to its last line, docstring included), and the function-level
``import torch`` lines (the parent's few CPU and meta-device probes) stay at 10 or fewer: worker modules
import torch at their top. A cheap scan (an `ast` parse of every module, about a second), no process.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from repo_paths import SRC

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
MAX_NESTED_TORCH_IMPORTS = 10


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (n lines)`` of each function or method under ``root`` longer than ``limit``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return out


def long_files(root: Path, limit: int = MAX_FILE_LINES) -> list[str]:
    """``path (n lines)`` of each module under ``root`` longer than ``limit``."""
    sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(root.rglob("*.py"))}
    return [f"{p.relative_to(root)} ({n} lines)" for p, n in sizes.items() if n > limit]


def nested_torch_imports(root: Path) -> list[str]:
    """The indented ``import torch`` lines under ``root`` (as ``grep -rn "^\\s\\+import torch" src``)."""
    pattern = re.compile(r"^\s+import torch")
    return [
        f"{p.relative_to(root)}:{i}"
        for p in sorted(root.rglob("*.py"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.match(line)
    ]


def test_no_file_in_src_is_over_400_lines():
    assert long_files(SRC) == []


def test_no_function_in_src_is_over_80_lines():
    assert long_functions(SRC) == []


def test_function_level_torch_imports_stay_few():
    found = nested_torch_imports(SRC)
    assert len(found) <= MAX_NESTED_TORCH_IMPORTS, found


def test_the_scans_report_what_breaks_a_rule(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))  # def line + 80: 81 lines
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\ndef short():\n    import torch\n")
    assert long_functions(tmp_path) == [f"m.py:1 long ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_files(tmp_path, limit=MAX_FUNCTION_LINES) == [f"m.py ({MAX_FUNCTION_LINES + 5} lines)"]
    assert nested_torch_imports(tmp_path) == [f"m.py:{MAX_FUNCTION_LINES + 5}"]
