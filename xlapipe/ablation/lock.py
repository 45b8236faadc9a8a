"""The lock on an ablation's output folder: one runner writes there at a time."""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
from pathlib import Path

LOCK_FILE = ".ablate.lock"


class OutLock:
    """An exclusive lock on an output folder, held while an ablation writes there (released on exit or death)."""

    def __init__(self, out: str | os.PathLike) -> None:
        self.path = Path(out) / LOCK_FILE
        self.fd: int | None = None

    def __enter__(self) -> OutLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise RuntimeError(
                    f"{self.path.parent} is in use by another `xlapipe ablate` ({holder}); two runners "
                    "cannot write the same --out at once: wait for it to finish, or give another --out"
                ) from None
            raise
        os.ftruncate(fd, 0)
        started = datetime.datetime.now().isoformat(timespec="seconds")
        os.pwrite(fd, f"pid {os.getpid()}, started {started}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *_: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
