"""Reading a damaged SQLite file page by page, without SQLite: the last resort of ``--recover``.

Why: SQLite reaches a row only through its table's b-tree, from the root page down. When an
interior page is damaged or cut off (truncation), the leaf pages below it are intact but
unreachable, and SQLite's own ``.recover`` (which finds them) is missing from many builds (Debian's
``sqlite3`` has none). This module parses the file format directly (sqlite.org/fileformat2.html):
the header, table b-tree pages, cells with their overflow chains and records. It walks each
table's b-tree from its root, tolerating damaged pages, then reads *orphaned* table-leaf pages (not
reached by any tree, not on the freelist) and gives their rows to the one core table whose column
count fits. Rows found so are only candidates: `deepgap.store.recover` keeps those that decode and
whose run survived, as it does for every row.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from deepgap.store.guard import decode_text

_LEAF, _INTERIOR = 0x0D, 0x05


@dataclass
class PageFile:
    """The bytes of a database file and the geometry its header gives."""

    data: bytes
    page_size: int
    usable: int

    @property
    def pages(self) -> int:  # noqa: D102
        return len(self.data) // self.page_size

    def page(self, n: int) -> bytes | None:
        """Page ``n`` (1-based), or None past the end."""
        if n < 1 or n > self.pages:
            return None
        return self.data[(n - 1) * self.page_size : n * self.page_size]


def open_file(path: str) -> PageFile | None:
    """The file at ``path`` as pages (None when its header gives no usable page size)."""
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) < 100:
        return None
    raw = int.from_bytes(data[16:18], "big")
    size = 65536 if raw == 1 else raw
    if size < 512 or size & (size - 1):
        return None
    reserved = data[20]
    return PageFile(data, size, size - reserved)


def varint(buf: bytes, i: int) -> tuple[int, int]:
    """SQLite's big-endian varint at ``buf[i]``: (value, next offset)."""
    v = 0
    for k in range(8):
        b = buf[i + k]
        v = (v << 7) | (b & 0x7F)
        if b < 0x80:
            return v, i + k + 1
    return (v << 8) | buf[i + 8], i + 9


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def record(payload: bytes) -> list[object]:
    """The values of one record (a ValueError if it does not parse)."""
    hsize, i = varint(payload, 0)
    if hsize > len(payload) or hsize < 1:
        raise ValueError("record header past its end")
    types = []
    while i < hsize:
        t, i = varint(payload, i)
        types.append(t)
    out: list[object] = []
    pos = hsize
    for t in types:
        if t == 0:
            out.append(None)
            continue
        if t in (8, 9):
            out.append(t - 8)
            continue
        if 1 <= t <= 6:
            n = (1, 2, 3, 4, 6, 8)[t - 1]
            out.append(int.from_bytes(payload[pos : pos + n], "big", signed=True))
        elif t == 7:
            n = 8
            out.append(struct.unpack(">d", payload[pos : pos + 8])[0])
        elif t >= 12:
            n = (t - 12) // 2
            raw = payload[pos : pos + n]
            out.append(raw if t % 2 == 0 else decode_text(raw))
        else:
            raise ValueError(f"serial type {t} is reserved")
        if pos + n > len(payload):
            raise ValueError("record value past its end")
        pos += n
    return out


def _header_at(pf: PageFile, n: int) -> int:
    return 100 if n == 1 else 0


def _cells(pf: PageFile, n: int) -> tuple[int, list[int], int, bytes] | None:
    """(page type, cell offsets, right-most child, page bytes) of b-tree page ``n``; None if not one."""
    page = pf.page(n)
    if page is None:
        return None
    h = _header_at(pf, n)
    kind = page[h]
    if kind not in (_LEAF, _INTERIOR):
        return None
    count = int.from_bytes(page[h + 3 : h + 5], "big")
    top = h + (12 if kind == _INTERIOR else 8)
    if top + 2 * count > pf.usable:
        return None
    offs = [int.from_bytes(page[top + 2 * k : top + 2 * k + 2], "big") for k in range(count)]
    if any(o < top + 2 * count or o >= pf.usable for o in offs):
        return None
    right = int.from_bytes(page[h + 8 : h + 12], "big") if kind == _INTERIOR else 0
    return kind, offs, right, page


def _payload(pf: PageFile, page: bytes, off: int, chain: set[int]) -> tuple[int, bytes]:
    """(rowid, full payload) of the table-leaf cell at ``off`` (following its overflow chain)."""
    size, i = varint(page, off)
    rowid, i = varint(page, i)
    u = pf.usable
    x = u - 35
    if size <= x:
        local = size
    else:
        m = ((u - 12) * 32 // 255) - 23
        k = m + (size - m) % (u - 4)
        local = k if k <= x else m
    body = bytearray(page[i : i + local])
    if local < size:
        nxt = int.from_bytes(page[i + local : i + local + 4], "big")
        seen = set()
        while nxt and len(body) < size:
            ov = pf.page(nxt)
            if ov is None or nxt in seen:
                raise ValueError("overflow chain broken")
            seen.add(nxt)
            chain.add(nxt)
            body += ov[4:u][: size - len(body)]
            nxt = int.from_bytes(ov[:4], "big")
    if len(body) < size:
        raise ValueError("payload cut short")
    return _signed(rowid), bytes(body)


def leaf_rows(pf: PageFile, n: int, chain: set[int]) -> Iterator[tuple[int, list[object]]]:
    """(rowid, values) of every cell of table-leaf page ``n`` that parses (overflow pages into ``chain``)."""
    cells = _cells(pf, n)
    if cells is None or cells[0] != _LEAF:
        return
    _, offs, _, page = cells
    for off in offs:
        try:
            rowid, body = _payload(pf, page, off, chain)
            yield rowid, record(body)
        except (ValueError, IndexError, struct.error):
            continue


def tree_leaves(pf: PageFile, root: int, seen: set[int]) -> list[int]:
    """The table-leaf pages reachable from ``root`` (damaged pages skipped); marks every visited page."""
    leaves, stack = [], [root]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        cells = _cells(pf, n)
        if cells is None:
            continue
        seen.add(n)
        kind, offs, right, page = cells
        if kind == _LEAF:
            leaves.append(n)
            continue
        stack += [int.from_bytes(page[o : o + 4], "big") for o in offs] + [right]
    return leaves


def freelist(pf: PageFile) -> set[int]:
    """The pages on the freelist (deleted content must not come back as rows)."""
    out: set[int] = set()
    trunk = int.from_bytes(pf.data[32:36], "big")
    while trunk and trunk not in out:
        page = pf.page(trunk)
        if page is None:
            break
        out.add(trunk)
        count = int.from_bytes(page[4:8], "big")
        if count > (pf.usable - 8) // 4:
            break
        out |= {int.from_bytes(page[8 + 4 * k : 12 + 4 * k], "big") for k in range(count)}
        trunk = int.from_bytes(page[:4], "big")
    return out


def rows_by_table(
    pf: PageFile, roots: dict[str, int], widths: dict[str, int]
) -> dict[str, dict[int, list[object]]]:
    """Table → rowid → values: each table's tree, then orphaned leaves by column count (``widths``).

    An orphan goes to the one table of its width, and only adds rowids its tree did not give.
    """
    seen: set[int] = set(freelist(pf))
    out: dict[str, dict[int, list[object]]] = {t: {} for t in roots}
    for t, root in roots.items():
        for leaf in tree_leaves(pf, root, seen):
            out[t].update(leaf_rows(pf, leaf, seen))  # overflow pages are no orphans either
    by_width: dict[int, list[str]] = {}
    for t, w in widths.items():
        by_width.setdefault(w, []).append(t)
    for n in range(2, pf.pages + 1):
        if n in seen:
            continue
        for rowid, values in leaf_rows(pf, n, set()):
            fits = [t for w, ts in by_width.items() for t in ts if len(values) <= w and len(values) >= w - 1]
            if len(fits) == 1 and rowid not in out.setdefault(fits[0], {}):
                out[fits[0]][rowid] = values
    return out
