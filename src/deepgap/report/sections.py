"""Every section of the report, listed once: importing a section's module registers it.

Why a list of imports here rather than module names in `deepgap.render.sections`: the report sits above
the features in the layers contract, so it may import their section modules, and import-linter sees each
dependency. A feature's section module calls `deepgap.render.sections.register` itself; adding a section
is that module plus one line below.
"""

from __future__ import annotations

from types import ModuleType

from deepgap.analysis import cards_section, decode_section, platforms_section, quant_layers_section
from deepgap.render import sections as render_sections
from deepgap.render.sections import Section, TableSpec
from deepgap.report import core
from deepgap.roofline import report_section as roofline_section
from deepgap.serving.show import report_section as serving_section

MODULES: tuple[ModuleType, ...] = (
    core,  # the measurements: tables and figures of the paper
    serving_section,  # serve runs
    roofline_section,  # rooflines and the paper's comparison
    platforms_section,  # two or more GPU platforms side by side
    quant_layers_section,  # the quant engine's layers on their roofline
    cards_section,  # the same configuration on each card of a GPU type
    decode_section,  # decode of LLMs: TTFT, TPOT, tokens/s, J/token (docs/llm.md)
)


def registered() -> list[Section]:
    """Every section of the report, in build order (importing this module registered them)."""
    return render_sections.registered()


def table_specs() -> dict[str, TableSpec]:
    """Every table any section of the report may add, with its declared spec, in build order."""
    return render_sections.table_specs()
