"""The store owns all SQL: no module outside ``deepgap.store`` touches a connection or writes SQL.

An AST scan, so that it can fail and points at the line: ``.con`` attributes, ``execute``-family calls
given SQL text, ``executemany``/``executescript``, ``pandas.read_sql*``, ``sqlite3.connect`` and string
literals that are SQL statements.
"""

import ast
import re

import repo_paths

SRC = repo_paths.SRC / "deepgap"
_SQL = re.compile(
    r"^\s*(CREATE (TABLE|INDEX)|INSERT (OR \w+ )?INTO|SELECT .+ FROM|UPDATE \w+ SET|DELETE FROM|"
    r"PRAGMA |ATTACH |ALTER TABLE|DROP TABLE)"
)


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
    return None


def sql_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for every use of SQL or of a store connection in ``source``."""
    tree = ast.parse(source)
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "con":
            found.append((node.lineno, ".con"))
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            owner = node.func.value if isinstance(node.func, ast.Attribute) else None
            if name in ("executemany", "executescript") or name.startswith("read_sql"):
                found.append((node.lineno, name))
            elif name == "execute" and node.args and _text(node.args[0]) is not None:
                found.append((node.lineno, "execute(SQL)"))
            elif name == "connect" and isinstance(owner, ast.Name) and owner.id == "sqlite3":
                found.append((node.lineno, "sqlite3.connect"))
        elif id(node) not in docstrings and (text := _text(node)) is not None and _SQL.match(text):
            found.append((node.lineno, f"SQL text {text[:30]!r}"))
    return found


def test_the_scan_finds_sql_and_connections():
    bad = """
import sqlite3
def f(store, con):
    store.con.execute("SELECT 1")
    con.execute(f"INSERT INTO t VALUES ({1})")
    con.executemany(q, rows)
    sqlite3.connect("x")
    q = "CREATE TABLE IF NOT EXISTS t (a)"
    pd.read_sql_query(q, c)
"""
    kinds = [what for _, what in sql_uses(bad)]
    assert kinds.count(".con") == 1 and kinds.count("execute(SQL)") == 2 and "executemany" in kinds
    assert "sqlite3.connect" in kinds and "read_sql_query" in kinds
    assert any(k.startswith("SQL text") for k in kinds)
    fine = '''
def g(pipe, first, count):
    """SELECT x FROM y in a docstring is prose."""
    return pipe.execute(first, count), "select a model from the list"
'''
    assert sql_uses(fine) == []


def test_no_sql_outside_the_store_package():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "store":
            continue
        offenders += [f"{rel}:{line}: {what}" for line, what in sql_uses(path.read_text())]
    assert not offenders, "SQL outside deepgap.store (add a Store method instead):\n" + "\n".join(offenders)
