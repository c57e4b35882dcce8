"""Progress display of a sweep: a rich bar with ETA and the last result, on stderr."""

from __future__ import annotations

from deepgap.core.events import Event
from deepgap.core.records import Status
from deepgap.core.result_details import real_tokens
from deepgap.core.stats import P99_MIN_N
from deepgap.core.wording import latency_words


def tail_text(lat) -> str:
    """'p99 1.234 ms (n=400)' only where n supports a p99, else 'max of n=20 1.234 ms' (analysis.tails)."""
    if lat.n >= P99_MIN_N:
        return f"p99 {lat.p99_s * 1e3:.3f} ms (n={lat.n})"
    return f"max of n={lat.n} {lat.max_s * 1e3:.3f} ms"


def rate_unit(spec) -> str:
    """'seq/s' for a text model (a sequence length), else 'img/s'."""
    return "seq/s" if getattr(spec, "seq_len", None) else "img/s"


def result_line(ev: Event) -> str:
    """One line for a finished configuration."""
    r = ev.result
    assert r is not None
    if r.status == Status.OK and r.latency and getattr(ev.spec, "is_decode", False):
        ttft = r.details.decode.ttft_median_s if r.details.decode else None
        ttft_text = f", TTFT {ttft * 1e3:.3f} ms" if ttft is not None else ""
        return (  # a decode row: its latency is a decode step's (TPOT), its rate decode tokens/s
            f"{ev.spec.label()}: {r.throughput_ips:,.1f} decode tokens/s, TPOT median "
            f"{r.latency.median_s * 1e3:.3f} ms/token, {tail_text(r.latency)}{ttft_text}"
        )
    if r.status == Status.OK and r.latency:
        ci = "" if r.ci_met is None else (" ci✓" if r.ci_met else " ci✗")
        seq = getattr(ev.spec, "seq_len", None)
        # a text model's tokens: a mixed-length batch's real ones per sequence, else its sequence length
        real = real_tokens(r.details)
        tokens = f" ({r.throughput_ips * (real if real == real else seq):,.0f} tokens/s)" if seq else ""
        median = latency_words(r.latency.median_s, ev.spec.batch_size, "sequence" if seq else None)
        return (
            f"{ev.spec.label()}: {r.throughput_ips:,.1f} {rate_unit(ev.spec)}{tokens}, "
            f"median {median}, {tail_text(r.latency)}{ci}"
        )
    return f"{ev.spec.label()}: {r.status.value} — {r.reason}"


class Progress:
    """Rich progress bar; disabled (``--quiet``/``--json``) it prints nothing."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._bar = None
        self._task = None

    def on_event(self, ev: Event) -> None:
        """Runner callback."""
        if not self.enabled:
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]deepgap"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=Console(stderr=True),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=ev.total)
        if ev.result is None:
            self._bar.update(self._task, description=f"measuring {ev.spec.label()}")
        else:
            self._bar.console.print(result_line(ev), highlight=False)
            self._bar.update(self._task, advance=1)

    def close(self) -> None:
        """Stop the live display."""
        if self._bar is not None:
            self._bar.stop()
