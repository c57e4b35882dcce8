"""The read flags of a command whose output is made to be shared (report, export): redacted by default.

Not a command (no ``NAME``): `deepgap.cli` skips it.
"""

from __future__ import annotations

from deepgap.core.errors import UsageError
from deepgap.store import guard


def add_shared_output_flags(p, no_redact_help: str) -> None:
    """`add_read_flags` and ``--no-redact`` for a command whose output is made to be shared (report, export).

    Redacting is their default; ``--redact`` stays so that older command lines still work
    (docs/input-and-redaction.md). `use_shared_output_flags` reads them.
    """
    guard.add_read_flags(p)
    p.add_argument("--no-redact", action="store_true", help=no_redact_help)


def use_shared_output_flags(args) -> bool:
    """Whether the output is redacted (unless ``--no-redact``); both flags at once is a usage error."""
    if getattr(args, "redact", False) and args.no_redact:
        raise UsageError(
            "--redact and --no-redact contradict each other", "pass one of them (redacting is the default)"
        )
    args.redact = not args.no_redact
    guard.use_read_flags(args)
    return args.redact
