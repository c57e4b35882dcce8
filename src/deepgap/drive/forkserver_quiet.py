"""Imported first by the fork server (`deepgap.drive.handle._PRELOAD`): it and its workers ignore Ctrl-C.

Why here and not in the parent: Ctrl-C reaches every process of the terminal's group, and a fork server
importing torch, or a worker importing deepgap, printed a traceback over the parent's one line (issue 46).
The parent used to set SIGINT to SIG_IGN while it started the server (so the server inherited it), but
the disposition is the whole process's: a Ctrl-C delivered in that window to another of the parent's
threads (numpy's BLAS pool) was dropped, and the run finished with 0. Now the parent only blocks SIGINT
in the starting thread (`deepgap.drive.handle._ctrl_c_blocked`); the server is born with it blocked, so a
Ctrl-C meanwhile waits, and this module — the first thing the server imports — ignores SIGINT (which
discards a pending one) and unblocks it. `multiprocessing.forkserver.main` records the handler it finds
(SIG_IGN) and restores it in every child it forks, so workers are born ignoring SIGINT; the parent,
which gets the Ctrl-C, stops them.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
