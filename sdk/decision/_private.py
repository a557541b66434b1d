"""Files only their owner may read: the decision log holds what an agent was asked and decided.

:func:`ensure_private_file` runs before the log is opened: the folder is created user-only
(0700), a folder every user may write to is refused unless it has the sticky bit (as ``/tmp``
has: there, others cannot replace a file they do not own), a file owned by another user is
refused, and the file is created, or tightened to, 0600. SQLite creates its ``-wal`` and
``-shm`` files with the database file's permissions, so they are user-only too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from capgate.errors import DataError

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def ensure_private_file(path: Path) -> None:
    """Create ``path`` (and its folder) readable and writable by its owner only.

    Raises:
        DataError: The folder is writable by every user without the sticky bit, or the file
            belongs to another user (the message names the path and its mode).
    """
    folder = path.parent
    folder.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    if os.name != "posix":  # no POSIX modes to check (Windows ACLs are the user's own)
        return
    mode = folder.stat().st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise DataError(
            f"the decision log's folder is writable by every user (mode {stat.S_IMODE(mode):o}, no "
            "sticky bit), so another user could replace the log: chmod o-w it or choose another folder",
            path=folder,
        )
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise DataError(
                f"the decision log belongs to another user (uid {info.st_uid}); refusing to use it",
                path=path,
            )
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)
