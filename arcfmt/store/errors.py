"""Errors of the stream layer (SPEC.md Part II). All are ``arcfmt.ArcError`` subclasses.

Bad stream objects (a manifest that is not valid JSON, a wrong name, a size beyond a limit, a hash
that does not match) raise the format's own classes (``CorruptError``, ``LimitError``,
``ChecksumError``, ``UnsupportedVersionError``) with a message naming the object; the classes
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


class NoStreamError(MissingError):
    """There is no stream at the URL at all: no head and no step objects (a typo'd path, a trainer
    not started yet)."""


class TransportError(ArcError):
    """The store kept failing after every retry (network, throttling, server errors, answers that do
    not match the request, requests past their deadline), or refused the request.

    ``transient``: raised for one attempt, a later attempt may succeed (the retry layer retries it
    within its budget, then raises a ``TransportError`` with ``transient`` False)."""

    category = "transport"

    def __init__(self, message: str = "", *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class SignatureError(ArcError):
    """A follower that trusts signing keys met a step it must not apply: unsigned, signed by a key it
    does not trust, a signature that does not verify, or bytes that do not hash to what was signed
    (SPEC.md S15)."""

    category = "signature"


__all__ = ["ConflictError", "MissingError", "NoStreamError", "SignatureError", "TransportError"]
