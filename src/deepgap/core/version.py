"""deepgap's version: the installed distribution's, else ``0.1.0+src`` for a source tree.

Why here and not only in ``deepgap/__init__``: a module that reads the version from the root package
depends on the root, which re-exports the public API from the top of the line; the version belongs at the
bottom, with the records it is stored beside.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("deepgap")
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.1.0+src"
