"""Generic typed reads and writes of the declared tables (`schema.TableSpec`), so features write no SQL.

Why here: the store is the one place that knows a table's columns and their SQLite types, so values
are converted once (NumPy scalars to Python numbers, NaN to NULL, booleans to 0/1, dicts and lists in
``*_json`` columns to JSON) and names are checked against the declaration: a misspelt column is a
`KeyError` in the caller's test, never a silently empty column.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from deepgap.store.schema import TABLES, TableSpec

if TYPE_CHECKING:
    import pandas as pd

Where = Mapping[str, Any]  # column → value (None: IS NULL; a list, tuple or set: IN)


def spec_of(table: TableSpec | str) -> TableSpec:
    """The declaration of ``table`` (a `KeyError` for a table nobody declared)."""
    return table if isinstance(table, TableSpec) else TABLES[table]


def typed(value: Any, decl: str, name: str) -> Any:
    """``value`` as SQLite should store it in a column of type ``decl``."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, (bytes, str)):  # a NumPy scalar
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and math.isnan(value):
        return None
    if name.endswith("_json") and not isinstance(value, str):
        return json.dumps(value, default=str)
    return value


def _where(spec: TableSpec, where: Where | None) -> tuple[str, list[Any]]:
    if not where:
        return "", []
    parts, args = [], []
    for col, value in where.items():
        spec.column(col)
        if value is None:
            parts.append(f"{col} IS NULL")
        elif isinstance(value, (list, tuple, set, frozenset)):
            values = list(value)
            parts.append(f"{col} IN ({','.join('?' for _ in values)})" if values else "0")
            args += values
        else:
            parts.append(f"{col} = ?")
            args.append(value)
    return " WHERE " + " AND ".join(parts), args


def _order(spec: TableSpec, order: Iterable[str] | None) -> str:
    cols = list(order or [])
    for c in cols:
        spec.column(c)
    return f" ORDER BY {', '.join(cols)}" if cols else ""


class TableAccess:
    """Typed insert/select on declared tables, for `deepgap.store.Store` (``con``, ``transaction``)."""

    con: sqlite3.Connection

    def insert(
        self,
        table: TableSpec | str,
        rows: Iterable[Mapping[str, Any]],
        replace: bool = False,
        ids: bool = True,
    ) -> list[int]:
        """Insert ``rows`` (dicts of declared columns; absent ones take their default) in one transaction.

        Returns the new row ids in order (``ids=False``: none, and rows of the same columns go to SQLite
        in one batch, for the many rows of a request log). ``replace``: a row whose key exists replaces it.
        """
        spec = spec_of(table)
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        out: list[int] = []
        with self.transaction() as con:  # type: ignore[attr-defined]
            batch: list[list[Any]] = []
            cols: list[str] = []
            for row in rows:
                if list(row) != cols:
                    self._flush(con, verb, spec, cols, batch)
                    cols, batch = list(row), []
                    types = [spec.column(c).type for c in cols]
                values = [typed(row[c], t, c) for c, t in zip(cols, types, strict=True)]
                if ids:
                    out.append(int(self._flush(con, verb, spec, cols, [values])))
                else:
                    batch.append(values)
            self._flush(con, verb, spec, cols, batch)
        return out

    @staticmethod
    def _flush(
        con: sqlite3.Connection, verb: str, spec: TableSpec, cols: list[str], batch: list[list[Any]]
    ) -> int | None:
        if not batch:
            return None
        sql = f"{verb} INTO {spec.name} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
        if len(batch) == 1:
            return con.execute(sql, batch[0]).lastrowid
        con.executemany(sql, batch)
        return None

    def select(
        self, table: TableSpec | str, where: Where | None = None, order: Iterable[str] | None = None
    ) -> list[dict[str, Any]]:
        """Rows of ``table`` as dicts of every declared column."""
        spec = spec_of(table)
        clause, args = _where(spec, where)
        sql = f"SELECT {', '.join(spec.names)} FROM {spec.name}{clause}{_order(spec, order)}"
        cur = self.con.execute(sql, args)
        return [dict(zip(spec.names, r, strict=True)) for r in cur.fetchall()]

    def table_frame(
        self, table: TableSpec | str, where: Where | None = None, order: Iterable[str] | None = None
    ) -> pd.DataFrame:
        """`select` as a DataFrame with every declared column (also when no row matches)."""
        import pandas as pd

        spec = spec_of(table)
        rows = self.select(spec, where, order)
        return pd.DataFrame.from_records(
            [tuple(r.values()) for r in rows], columns=spec.names, coerce_float=True
        )

    def count(self, table: TableSpec | str, where: Where | None = None) -> int:
        """How many rows of ``table`` match ``where``."""
        spec = spec_of(table)
        clause, args = _where(spec, where)
        return int(self.con.execute(f"SELECT count(*) FROM {spec.name}{clause}", args).fetchone()[0])
