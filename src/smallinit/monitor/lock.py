"""RUN/.lock: a run folder has one writer. A training process (or a Monitor writing a folder of its own)
takes the lock before it reads or writes the folder and holds it until it is done (the OS drops it if the
process dies), so a second ``smallinit train`` into the same folder (a fresh run, ``--resume``, an
extension or ``--init-from``) is refused before it touches anything, whether it comes before or after the
first checkpoint."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from smallinit import io
from smallinit.errors import ConfigError

LOCK_FILE = ".lock"


class RunLock:
    """The exclusive lock on a run folder; ``release`` (or the end of the process) gives it up."""

    def __init__(self, run_dir: Path, fd: int, made: list[Path]):
        self.run_dir, self._made = run_dir, made  # what taking the lock created, innermost first
        self._fd: int | None = fd

    @staticmethod
    def take(run_dir: Path, option: str = "--out") -> RunLock:
        """Lock ``run_dir`` (made if absent), or one line if another process holds it; ``option`` is how the
        user named the folder (the CLI's --out, the Monitor's out=)."""
        if run_dir.exists() and not run_dir.is_dir():
            raise ConfigError(f"{option} {run_dir} is a file, not a folder; choose another {option}")
        # innermost first
        made = [p for p in (run_dir / LOCK_FILE, run_dir, *run_dir.parents) if not p.exists()]
        io.make_folder(run_dir)
        fd = io.lock_exclusive(run_dir / LOCK_FILE)
        if fd is None:
            raise ConfigError(
                f"run folder {run_dir} is being written by another training process; wait for "
                f"it to finish or stop it, or choose another {option}"
            )
        return RunLock(run_dir, fd, made)

    def release(self, *, failed: bool = False) -> None:
        """Give the lock up; ``failed``: this process could not start its run, so the lock file and folder it
        made are removed again (bad input leaves nothing behind)."""
        if self._fd is None:
            return
        if failed:
            with contextlib.suppress(OSError):
                for path in self._made:
                    if path == self.run_dir / LOCK_FILE:
                        path.unlink()
                    else:
                        path.rmdir()  # only if nothing else was written
        os.close(self._fd)
        self._fd = None
