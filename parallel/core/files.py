"""Reading a small file a user names -- a device fit, a calibration, a launch script, a plan -- the one
safe way: a regular file only (a FIFO or a device would block the read, or never end) and at most a
known number of bytes (one byte more is read to tell a larger file apart). Each caller words the
failure in its own terms.

Pure: stdlib only.
"""

from __future__ import annotations

import os
from pathlib import Path


class NotARegularFile(ValueError):
    """The path names a FIFO, a device, a directory or a socket."""


class TooLarge(ValueError):
    """The file holds more than `limit` bytes."""

    def __init__(self, limit: int):
        super().__init__(f"larger than {limit:,} bytes")
        self.limit = limit


def read_bounded(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them: NotARegularFile, TooLarge, or
    the OSError of opening or reading it (FileNotFoundError when it does not exist)."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise NotARegularFile("not a regular file")
    with open(p, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(limit)
    return data
