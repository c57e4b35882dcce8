"""The HTML report and the console comparison: sections assembled into one page (`page`).

The report reads the store through `deepgap.analysis` and draws with `deepgap.render`; features add
their own sections (`deepgap.render.sections.register`), imported by `page`.
"""
