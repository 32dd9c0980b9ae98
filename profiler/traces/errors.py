"""Typed errors for trace input that cannot be read, each with a message that says what and where.

Every problem with a user's files raises a subclass of `TraceError` (itself a `ValueError`), so a
caller can catch one type, show `str(err)` as one line, and never print a traceback. Each message
names the file (or archive member) and, where there is one, the fix.

Pure: stdlib only.
"""

from __future__ import annotations

from runfiles.lines import one_line


class TraceError(ValueError):
    """Base class: the input is not a readable set of Kineto traces."""

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(one_line(message))
        self.path = path


class NoTracesError(TraceError):
    """The path holds no trace files (or does not exist)."""


class NotJSONError(TraceError):
    """A file is not valid JSON (malformed, truncated JSON, empty)."""


class EncodingError(NotJSONError):
    """A file holds bytes that are not UTF-8 (JSON must be UTF-8)."""


class CompressionError(TraceError):
    """A compressed file or archive is corrupt or truncated."""


class TooLargeError(TraceError):
    """Decompressed data would exceed the size cap (a gzip or zip bomb, or simply too big)."""


class UnsafeArchiveError(TraceError):
    """An archive member escapes its folder, or is a link or device."""


class NotKinetoError(TraceError):
    """Valid JSON, but not a Kineto trace (no ``traceEvents`` list, wrong shapes)."""


class EmptyTraceError(TraceError):
    """A Kineto trace without a single usable event."""


class RankError(TraceError):
    """The rank that wrote a file cannot be told (no distributedInfo, no rank in the name)."""


class DuplicateRankError(TraceError):
    """Two files claim the same rank."""


class MixedJobError(TraceError):
    """Files from different jobs were mixed (their world sizes or backends disagree)."""


class PlanMismatchError(TraceError):
    """The plan given for labelling does not fit the traces (its world size differs)."""
