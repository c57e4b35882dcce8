"""``merge --redact``: every machine identifier in a store file replaced by a keyed token, in place.

Why a pass over every text column, not only the fingerprints: a host name also sits in the stored
command line, in Ray lane strings and error reasons. Identifiers are learnt first from every
fingerprint, result and JSON column (`deepgap.core.redaction.Redactor.learn`), and only then is text
scrubbed, so a name learnt from a later table is scrubbed from an earlier one too. The key is the
command's (`deepgap.core.redaction.current`): random unless ``DEEPGAP_REDACT_KEY`` is set, never stored.
"""

from __future__ import annotations

import json

from deepgap.core.redaction import REDACT_KEYS, current
from deepgap.store import Store
from deepgap.store.guard import column_types

_SKIP = ("samples",)  # numbers only


def _load(text: str):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def redact_all(store: Store) -> None:
    """Host names, GPU serials/UUIDs, node ids and addresses of every table → keyed tokens."""
    con, red = store.con, current()
    con.execute("PRAGMA secure_delete = ON")  # the replaced names must not linger in freed pages
    con.execute("BEGIN IMMEDIATE")
    tables = [
        n
        for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        if n not in _SKIP and not n.startswith("sqlite_")
    ]
    columns = {t: column_types(con, t) for t in tables}
    for t in tables:  # learn every identifier before rewriting any text
        for col in columns[t]:
            low = col.lower()
            if low.endswith("_json"):
                for (text,) in con.execute(f"SELECT {col} FROM {t} WHERE {col} IS NOT NULL").fetchall():
                    red.learn(_load(text))
            elif low in REDACT_KEYS:
                for (value,) in con.execute(f"SELECT DISTINCT {col} FROM {t}").fetchall():
                    red.learn({low: value})
    for t in tables:
        for col, (decl, _) in columns[t].items():
            low = col.lower()
            if low in REDACT_KEYS:
                new = red.token
            elif low.endswith("_json"):

                def new(text):
                    data = _load(text)
                    return text if data is None else json.dumps(red.tree(data), default=str)
            elif decl in ("TEXT", ""):
                new = red.text
            else:
                continue
            rows = con.execute(f"SELECT rowid, {col} FROM {t} WHERE {col} IS NOT NULL").fetchall()
            for rowid, value in rows:
                if isinstance(value, str) or low in REDACT_KEYS:
                    replaced = new(value)
                    if replaced != value:
                        con.execute(f"UPDATE {t} SET {col} = ? WHERE rowid = ?", (replaced, rowid))
    con.execute("COMMIT")
