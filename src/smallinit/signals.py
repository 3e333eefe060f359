"""Stop requests: SIGTERM and SIGINT (what SLURM, Kubernetes and Ctrl-C send) recorded instead of fatal.

The trainer checks the record between steps and checkpoints before it exits; the sweep runner passes the
request on to its cells and waits for them. Both then exit with ``Preempted.exit_code`` (75). A process
whose parent dies (a sweep's cell, a torchrun worker whose launcher was killed, even by SIGKILL) gets the
same request.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
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


def term_on_parent_death() -> None:
    """For ``preexec_fn`` (Linux): the child gets SIGTERM when its parent dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: a killed parent leaves the child running


_WATCHER = "smallinit-parent-watch"


def stop_with_parent(grace: float, poll: float = 1.0) -> None:
    """Stop this process once its parent has died (for a process started by someone else's launcher, where
    no ``preexec_fn`` can be set): SIGTERM to itself, a stop request, then SIGKILL if it is still alive
    ``grace`` seconds later, as a launcher stops its workers. The parent's death shows as a new parent pid
    (the process is adopted); checked every ``poll`` seconds by a daemon thread, one per process."""
    if any(t.name == _WATCHER for t in threading.enumerate()):
        return
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name=_WATCHER, daemon=True).start()
