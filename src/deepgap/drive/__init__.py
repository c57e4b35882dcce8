"""One run, from its configuration to its stored results: config → plan → drive → launcher → worker.

`config` validates a `SweepSpec`, `plan` expands it, the run session (`session`) opens, records and
finishes the run with its prelude (`prelude`: idle baseline, thermal warm-up), the runner launches and
supervises the worker process (`runner`, `inprocess` for tests), and `worker` answers its requests.
"""
