"""Errors of the stream layer (SPEC.md Part II). All are ``arcfmt.ArcError`` subclasses.

Bad stream objects (a manifest that is not valid JSON, a wrong name, a size beyond a limit, a hash
that does not match) raise the format's own classes (``CorruptError``, ``LimitError``,
``ChecksumError``, ``UnsupportedVersionError``) with a message naming the object; the three classes
here cover what only a stream can do.
"""
from __future__ import annotations

from ..errors import ArcError


class ConflictError(ArcError):
    """A commit lost: another publisher already created a different object for this step or shard,
    or the shards of a step disagree so that no manifest can be written."""

    category = "conflict"


class MissingError(ArcError):
    """An object the stream needs does not exist: no head yet, or an object a manifest names."""

    category = "not_found"


class TransportError(ArcError):
    """The store kept failing after every retry (network, throttling, server errors)."""

    category = "transport"


__all__ = ["ConflictError", "MissingError", "TransportError"]
