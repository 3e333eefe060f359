"""Files on disk: written so a crash never leaves half of one, hashed, and read back.

Every complete file and folder the package writes goes through here (appended logs and the token cache's
streamed files are the exceptions, docs/architecture.md). A file is written to a temporary name beside
it, fsynced, then renamed over the target, so a reader sees the old file or the new one; a folder is built
under a temporary name and renamed when complete. A failed write (disk full, read-only folder) raises
StorageError with one line saying what to do, and leaves what was there before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from safetensors import SafetensorError

from smallinit.errors import StorageError

Kept = Callable[[], str]  # says, at the time of a failure, what the failed write left intact


def temp_name(path: Path) -> Path:
    """The temporary sibling a writer in this process builds ``path`` under (hidden, so globs skip it)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def storage_error(path: Path, e: BaseException, kept: Kept | None = None) -> StorageError:
    """One line for a failed write: what, why (ENOSPC, EROFS, ...), what to do, and what was kept."""
    why = (
        (e.strerror if isinstance(e, OSError) else None)
        or str(e).split("I/O error: ")[-1]
        or type(e).__name__
    )
    note = f"; {kept()}" if kept is not None else ""
    return StorageError(
        f"cannot write {path} ({why}); free disk space or make the folder writable{note}", why
    )


def _is_io_failure(e: BaseException) -> bool:
    return isinstance(e, OSError) or (isinstance(e, SafetensorError) and "I/O error" in str(e))


def write_atomic(
    path: str | os.PathLike, write: Callable[[BinaryIO], Any], *, kept: Kept | None = None
) -> None:
    """``write(file)`` to a temporary name, fsync, then rename: readers see the old file or the new one."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise storage_error(path, e, kept) from None
    finally:
        with contextlib.suppress(OSError):  # the folder itself may be unusable; the error above says so
            tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike, text: str, *, kept: Kept | None = None) -> None:
    write_atomic(path, lambda f: f.write(text.encode("utf-8")), kept=kept)


def write_json_atomic(path: str | os.PathLike, obj: Any, *, kept: Kept | None = None, **dumps: Any) -> None:
    """``obj`` as JSON (``indent=2, sort_keys=True`` unless ``dumps`` says otherwise)."""
    text = json.dumps(obj, **{"indent": 2, "sort_keys": True, **dumps})
    write_text_atomic(path, text, kept=kept)


def make_folder(folder: str | os.PathLike) -> None:
    """``folder`` and its parents, or one StorageError line saying why not."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise storage_error(Path(folder), e) from None


def lock_exclusive(path: str | os.PathLike) -> int | None:
    """An exclusive advisory lock on ``path`` (created if absent): its descriptor, or None if another process
    holds it. The lock lasts until the descriptor is closed or the process ends; the OS drops it on a crash,
    so a stale lock file never blocks. Without advisory locks (no fcntl) the descriptor locks nothing."""
    try:
        import fcntl
    except ImportError:
        fcntl = None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise storage_error(Path(path), e) from None
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
    return fd


def write_result(path: str | os.PathLike, obj: Any) -> Path:
    """A measurement's JSON, in the order it was built (parent folders made; numpy scalars written as floats)."""
    path = Path(path)
    make_folder(path.parent)
    write_json_atomic(path, obj, indent=1, sort_keys=False, default=float)
    return path


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def publishing(folder: str | os.PathLike, *, kept: Kept | None = None) -> Iterator[Path]:
    """A temporary sibling of ``folder`` to write into, renamed to ``folder`` when the block succeeds (an
    existing ``folder`` is replaced) and removed when it fails; a failed write becomes one StorageError."""
    folder = Path(folder)
    tmp = temp_name(folder)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        yield tmp
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
        fsync_dir(folder.parent)
    except BaseException as e:
        if _is_io_failure(e):
            raise storage_error(folder, e, kept) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 hex digest of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_json(path: str | os.PathLike) -> Any:
    """The parsed file, or None if it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (
        OSError,
        json.JSONDecodeError,
        UnicodeDecodeError,
        RecursionError,  # nested too deep
    ):
        return None
