"""deepgap: the inference benchmark behind the DEEP-GAP study, as a tool.

``deepgap.run(spec) -> Results`` measures a sweep into an SQLite store; ``Results.to_pandas()``
returns it as a DataFrame. The ``deepgap`` command wraps the same calls.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("deepgap")
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.1.0+src"

from deepgap.api import Results, run  # noqa: E402
from deepgap.config import SweepSpec  # noqa: E402
from deepgap.records import ConfigSpec, Result, Status  # noqa: E402

__all__ = ["ConfigSpec", "Result", "Results", "Status", "SweepSpec", "__version__", "run"]
