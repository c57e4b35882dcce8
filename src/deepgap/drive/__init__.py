"""One run, from its configuration to its stored results: config → plan → drive → launcher → worker.

`config` validates a `SweepSpec`, `plan` expands it; `loop.drive` is the one driver every kind of run goes
through (resume → validate → open → prelude → loop → finish), a kind being a `loop.Job`; the run session
(`session`) opens, records and finishes the run with its prelude (`prelude`: idle baseline, thermal
warm-up); a `launcher.Launcher` starts and supervises the workers (`runner`, `inprocess` for tests; the
fleet's and serving's launchers live in their features), and `worker` answers their requests.
"""
