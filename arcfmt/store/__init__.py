"""Delta streams over object storage (SPEC.md Part II): trainer shards publish, rollout regions follow.

    from arcfmt.store import Publisher, Follower
    Publisher("s3://bucket/run42", shard=3, num_shards=8).publish(17, tensors)
    for update in Follower("s3://bucket/run42", into="/models/run42").follow():
        engine.load_weights(update.weights())

Any fsspec URL works: local paths, ``s3://`` (s3fs), ``gs://``/``gcs://`` (gcsfs), ``memory://``.

Modules: ``publisher`` and ``follower`` (the two sides), ``mirror`` (a regional copy of a stream),
``objects`` (the JSON objects: head, manifest, descriptor), ``names`` (object names, checked),
``backends`` (one adapter class per kind of store, and ``Store``, a stream root's objects), ``ranges``
(bounded range reads, the spool),
``retry`` (the one retry layer, deadlines), ``errors``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

# Imported when first used (arcfmt.lazy): the command imports ``arcfmt.store.retry`` for every
# command, which used to load the publisher, the follower and every backend with it.
_LAZY = dict(
    ConflictError="errors", MissingError="errors", NoStreamError="errors", SignatureError="errors",
    TransportError="errors", Follower="follower", StepUpdate="follower", StepInfo="inventory",
    StreamStatus="inventory", status="inventory", Mirror="mirror", MirrorResult="mirror", PruneResult="prune",
    prune="prune", CommitResult="publisher", Publisher="publisher", PublishResult="publisher",
    FetchStats="ranges",
)

if TYPE_CHECKING:
    from .errors import ConflictError, MissingError, NoStreamError, SignatureError, TransportError
    from .follower import Follower, StepUpdate
    from .inventory import StepInfo, StreamStatus, status
    from .mirror import Mirror, MirrorResult
    from .prune import PruneResult, prune
    from .publisher import CommitResult, Publisher, PublishResult
    from .ranges import FetchStats

    STREAM_VERSION: tuple[int, int]
    STREAM_MAJOR: int
    STREAM_MINOR: int


def _stream_version() -> tuple[int, int]:   # the stream layout this package publishes (SPEC.md S11)
    from .objects import MAJOR, MINOR
    return (MAJOR, MINOR)


_COMPUTED = {"STREAM_VERSION": _stream_version, "STREAM_MAJOR": lambda: _stream_version()[0],
             "STREAM_MINOR": lambda: _stream_version()[1]}


if not TYPE_CHECKING:   # type checkers see the imports above, and an unknown name stays an error
    from ..lazy import module_attributes

    __getattr__, __dir__ = module_attributes(__name__, _LAZY, _COMPUTED)
    del module_attributes


__all__ = ["Publisher", "Follower", "StepUpdate", "Mirror", "MirrorResult", "PublishResult", "CommitResult",
           "FetchStats", "ConflictError", "MissingError", "SignatureError", "TransportError", "STREAM_VERSION"]
__all__ += ["NoStreamError"]
__all__ += ["status", "StreamStatus", "StepInfo", "prune", "PruneResult"]   # retention (S16)
