"""Stop requests: SIGTERM and SIGINT (what SLURM, Kubernetes and Ctrl-C send) recorded instead of fatal.

The trainer checks the record between steps and checkpoints before it exits; the sweep runner passes the
request on to its cells and waits for them. Both then exit with ``Preempted.exit_code`` (75).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def stop_requests() -> Iterator[list[str]]:
    """Yields a list that holds the signal's name once one arrived. Handlers are installed only in the main
    thread (Python allows no other) and restored on exit."""
    stop: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, _frame):
        stop.append(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
