"""Serving: ``deepgap serve``, capacity at an SLO and the plans made from it, in subpackages by role.

`worker` | `show` → `run` → `capacity` | `loadgen` → `sim` | `records` (pyproject.toml's ``serving-layers``).
"""
