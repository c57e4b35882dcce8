"""Reading a store's results: as DataFrames joined with their runs, their raw samples and telemetry.

Why a mixin of its own: `deepgap.store.Store` opens, migrates, locks and writes; what every view reads of
it (the results table with each row's host, device and card, the per-repeat latencies, telemetry) is
here, on the same connection, with the same checks (`RowDecoder`: a damaged row is named, never guessed).
"""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING, Any

import numpy as np

from deepgap.core.envinfo import redact, redact_text
from deepgap.core.records import ConfigSpec, Status
from deepgap.core.result_details import ResultDetails, real_tokens

if TYPE_CHECKING:
    import pandas as pd

_STATUSES = {s.value for s in Status}


class ResultReads:
    """Result, sample and telemetry reads for `deepgap.store.Store` (``con``, ``redact``, ``runs``)."""

    con: sqlite3.Connection
    redact: bool

    def run_telemetry(self, run_id: str) -> list[tuple[str, float, dict[str, Any]]]:
        """The run-level telemetry of a run (idle baseline, thermal warm-up, summaries), oldest first."""
        rows = self.con.execute(
            "SELECT * FROM telemetry WHERE run_id=? AND result_id IS NULL ORDER BY t_s", (run_id,)
        ).fetchall()
        return [
            (r["phase"], r["t_s"], json.loads(r["data_json"]))
            for r in self._decoded("telemetry", rows, "run_id")
        ]

    def samples(self, result_id: int) -> list[np.ndarray]:
        """Per-repeat latency arrays of one result."""
        rows = self.con.execute(
            "SELECT latencies_s FROM samples WHERE result_id=? ORDER BY repeat", (result_id,)
        ).fetchall()
        out = []
        for r in rows:
            if isinstance(r[0], bytes) and len(r[0]) % 8 == 0:
                out.append(np.frombuffer(r[0], dtype="<f8"))
            else:
                self._bad("samples", f"of result_id {result_id}", "latencies_s is not a float64 array")
        return out

    def telemetry_frame(self, run_id: str | None = None) -> pd.DataFrame:
        """Telemetry samples as a long DataFrame (one row per sample, metrics as columns)."""
        import pandas as pd

        q = "SELECT run_id, result_id, phase, t_s, data_json FROM telemetry"
        args: tuple[Any, ...] = ()
        if run_id:
            q += " WHERE run_id=?"
            args = (run_id,)
        rows = self._decoded("telemetry", self.con.execute(q, args).fetchall(), "run_id")
        recs = [
            {
                "run_id": r["run_id"],
                "result_id": r["result_id"],
                "phase": r["phase"],
                "t_s": r["t_s"],
                **json.loads(r["data_json"]),
            }
            for r in rows
        ]
        return pd.DataFrame.from_records(recs)

    def results_frame(self, run_ids: list[str] | None = None) -> pd.DataFrame:
        """Every forward-pass result as a DataFrame, joined with its run's host, device name and versions.

        Decode results (a key with ``output_len``: issue 51's ``--workload decode``) are left out: their
        latency is a decode step's and their rate tokens/s, which no view of forward passes may pool
        with images/s or sequences/s; `decode_frame` reads them.
        """
        df = self._results(run_ids)
        forward = np.array([ConfigSpec.decode_lens_of(k) is None for k in df["config_key"]], dtype=bool)
        return df.loc[forward].reset_index(drop=True)

    def decode_frame(self, run_ids: list[str] | None = None) -> pd.DataFrame:
        """The decode results (`results_frame`'s other part), with ``input_len``, ``output_len``, ``kv_cache``.

        The figures themselves are each row's ``extra.decode`` (`deepgap.core.result_details.Decode`);
        `deepgap.analysis.decode` turns them into the views' columns. ``kv_cache`` is a key-only field read
        from the key as ``input_mode`` is: "" for the decoder's own dtype (a grouping key: None would drop
        the row's group), "fp8" for an fp8 cache.
        """
        df = self._results(run_ids)
        lens = [ConfigSpec.decode_lens_of(k) for k in df["config_key"]]
        df = df.loc[np.array([x is not None for x in lens], dtype=bool)].reset_index(drop=True)
        df["input_len"] = [x[0] for x in lens if x is not None]
        df["output_len"] = [x[1] for x in lens if x is not None]
        df["kv_cache"] = [ConfigSpec.kv_cache_of(k) or "" for k in df["config_key"]]
        return df

    def _results(self, run_ids: list[str] | None) -> pd.DataFrame:
        """Every result, forward and decode, as a DataFrame (see `results_frame`)."""
        import pandas as pd

        q = "SELECT * FROM results"
        args: tuple[Any, ...] = ()
        if run_ids:
            q += f" WHERE run_id IN ({','.join('?' for _ in run_ids)})"
            args = tuple(run_ids)
        cur = self.con.execute(q + " ORDER BY result_id", args)
        cols = [c[0] for c in cur.description]
        runs = {r["run_id"]: r for r in self.runs()}
        rows = []
        for d in self._decoded("results", cur.fetchall(), "result_id"):
            if d["run_id"] not in runs:
                self._bad(
                    "results",
                    f"result_id {d['result_id']!r}",
                    f"its run {d['run_id']!r} is missing or damaged",
                )
            elif d["status"] not in _STATUSES:
                self._bad("results", f"result_id {d['result_id']!r}", f"status {d['status']!r} is unknown")
            else:
                rows.append(tuple(d[c] for c in cols))
        df = pd.DataFrame.from_records(rows, columns=cols, coerce_float=True)
        extras = [json.loads(x) for x in df.pop("extra_json")]
        if self.redact:
            extras = [redact(e) for e in extras]
            df["reason"] = [redact_text(r) for r in df["reason"]]
        # a fleet result carries its own node's fingerprint (deepgap.fleet); else the run's
        nodes = [e.get("node_env") if isinstance(e.get("node_env"), dict) else {} for e in extras]
        # the ``extra`` column holds typed `ResultDetails` (its JSON is the stored ``extra_json``)
        df["device_name"] = [
            n.get("device_name") or runs[r]["env"].get("device_name", "")
            for n, r in zip(nodes, df["run_id"], strict=True)
        ]
        df["host"] = [n.get("host") or runs[r]["host"] for n, r in zip(nodes, df["run_id"], strict=True)]
        # the card that measured it (GPU UUID, else serial; redacted with the rest): the card-to-card level
        df["card"] = [
            str(
                n.get("gpu_uuid")
                or n.get("gpu_serial")
                or runs[r]["env"].get("gpu_uuid")
                or runs[r]["env"].get("gpu_serial")
                or ""
            )
            for n, r in zip(nodes, df["run_id"], strict=True)
        ]
        df["extra"] = [ResultDetails.from_json(e) for e in extras]
        real = [real_tokens(e) for e in df["extra"]]  # a mixed-length text batch's real tokens per sequence
        if any(v == v for v in real):  # only where a row has one: every other store's frame is unchanged
            df["tokens_per_sample"] = real
        df["seq_len"] = [ConfigSpec.seq_len_of(k) for k in df["config_key"]]  # a key-only field
        # a key-only field too; "" is the default input (a grouping key: None would drop the row's group)
        df["input_mode"] = [ConfigSpec.input_mode_of(k) or "" for k in df["config_key"]]
        return df

    def extra_json(self) -> dict[int, str]:
        """Every result's stored ``extra_json`` text by ``result_id``, undecoded.

        What `ResultDetails` reads and writes: for checks that its JSON is the stored one byte for byte.
        """
        rows = self.con.execute("SELECT result_id, extra_json FROM results ORDER BY result_id").fetchall()
        return {int(r[0]): r[1] for r in rows}

    def result_configs(self, run_id: str) -> list[ConfigSpec]:
        """The ConfigSpecs stored for a run, in insertion order."""
        rows = self.con.execute("SELECT config_key FROM results WHERE run_id=? ORDER BY result_id", (run_id,))
        return [ConfigSpec.from_key(r[0]) for r in rows]
