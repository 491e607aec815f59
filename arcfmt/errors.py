"""One error hierarchy: every way an input can be bad raises a subclass of ArcError.

Each class carries the SPEC.md §15 ``category`` string that conformance vectors name.
"""
from __future__ import annotations

import os


class ArcError(Exception):
    """Root of every error arcfmt raises on bad input or a failed check."""

    category = "error"


class FormatError(ArcError):
    """The bytes are not a valid arcfmt file (SPEC.md §15)."""

    category = "corrupt"


class BadMagicError(FormatError):
    """Not an arcfmt file: the first bytes are not the magic (SPEC.md §4)."""

    category = "bad_magic"


class UnsupportedVersionError(FormatError):
    """A major format version this decoder does not implement (SPEC.md §16)."""

    category = "unsupported_version"


class TruncatedError(FormatError):
    """The input ends before the structure does, or its last 40 bytes are not a trailer."""

    category = "truncated"


class ChecksumError(FormatError):
    """A record or trailer checksum does not match its bytes."""

    category = "checksum"


class ReservedBitsError(FormatError):
    """A reserved field or bit is not zero."""

    category = "reserved_bits"


class LimitError(FormatError):
    """A declared size, count or resource need exceeds the limits of SPEC.md §14 (or the output budget)."""

    category = "limit"


class UnknownRecordError(FormatError):
    """A critical record type this decoder does not know."""

    category = "unknown_record"


class UnsupportedError(FormatError):
    """An unknown dtype, encoding or codec id, or an encoding that does not fit the dtype."""

    category = "unsupported"


class CorruptError(FormatError):
    """Any other structural violation: order, offsets, names, stream contents, varints."""

    category = "corrupt"


class WrongBaseError(ArcError):
    """The base given is not the one the delta was made from."""

    category = "wrong_base"


class MissingPreviousError(WrongBaseError):
    """A tensor needs the previous step (format 1.9, SPEC.md §7 "History") and none was given for it: a
    follower that lost it starts again from a keyframe (SPEC.md S9.4)."""


class VerificationError(ArcError):
    """A reconstructed tensor or model does not hash as the file declares."""

    category = "verification"


class InputError(ArcError):
    """A caller's input (arrays, checkpoint files, arguments) cannot be used."""

    category = "input"


class SafetensorsError(InputError):
    """A safetensors checkpoint file is malformed."""

    category = "safetensors"


class MissingTensorError(InputError, KeyError):
    """A tensor the caller named is not in the file (also a ``KeyError``, as for a mapping)."""

    category = "input"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class FileAccessError(InputError):
    """The operating system refused to read or write a path the caller named (missing, no permission,
    disk full, read-only): the user's problem to fix, never an internal error."""

    category = "io"


def os_error(exc: OSError, verb: str, path: str | os.PathLike[str]) -> FileAccessError:
    """One wording for every OS error on a caller's path: ``cannot read|write PATH: reason``."""
    reason = exc.strerror or str(exc)
    return FileAccessError(f"cannot {verb} {path}: {reason}")


ALL_ERRORS = [
    ArcError, FormatError, BadMagicError, UnsupportedVersionError, TruncatedError, ChecksumError,
    ReservedBitsError, LimitError, UnknownRecordError, UnsupportedError, CorruptError, WrongBaseError,
    VerificationError, InputError, SafetensorsError, FileAccessError, MissingTensorError,
]
