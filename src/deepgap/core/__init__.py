"""The bottom of the line: typed records, errors, the precision table, limits, statistics and guards.

Everything above imports from here; nothing here imports from above (import-linter's layers contract).
The store stores these records; the worker fills them; analysis and the report read them.
"""
