"""What one profile carries beyond its columns, as a typed record: ``roofline_profiles.extra_json``.

Why typed: the keys were a dict filled in one place and read in others by string; a typed record names
them once, with their meaning. `ProfileDetails.to_json` writes exactly the JSON object the store always
held (same keys, same order, ``busy_fraction`` null on a CPU), and `from_json` reads it back keeping
unknown keys (an older or newer deepgap, a hand-edited store) in ``other``, so a round trip loses
nothing. Key inventory (producer → readers; "record" = kept for the record only), all written by
`deepgap.roofline.profile_measure.run_profile` once a profile is measured (a failed one writes none):

* ``busy_fraction`` → roofline.console (the profile's summary line and table).
* ``profiled_ops_per_step``, ``counted_flops_per_step``, ``unattributed_kernel_time_s``,
  ``step_time_mean_s``, ``step_time_min_s``, ``torch`` → record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deepgap.core.result_details import JsonRecord


@dataclass
class ProfileDetails(JsonRecord):
    """A `ProfileResult`'s details; the field order is the write order."""

    profiled_ops_per_step: float | None = None  # aten ops the OpCounter saw per profiled step
    counted_flops_per_step: float | None = None  # the FLOPs those ops account for, per step
    # GPU: kernel time / step time (low = launch-bound); None on a CPU, whose op times under a profiler
    # are not kernel time (written as null whenever the profile was measured)
    busy_fraction: float | None = None
    unattributed_kernel_time_s: float | None = None  # kernel time per step no annotated op launched
    step_time_mean_s: float | None = None
    step_time_min_s: float | None = None
    torch: str | None = None  # torch.__version__ of the profiling process

    def to_json(self) -> dict[str, Any]:
        """The JSON object; a measured profile built by its producer writes ``busy_fraction`` even as null."""
        out = super().to_json()
        if self.keys_read is not None or self.profiled_ops_per_step is None or "busy_fraction" in out:
            return out
        out["busy_fraction"] = None
        return {k: out[k] for k in dict.fromkeys([*self.declared(), *out]) if k in out}

    @classmethod
    def of(cls, x: ProfileDetails | dict[str, Any] | None) -> ProfileDetails:
        """``x`` as details: a parsed JSON object is read, None (no details) is empty."""
        if isinstance(x, ProfileDetails):
            return x
        return cls.from_json(x) if isinstance(x, dict) else cls()
