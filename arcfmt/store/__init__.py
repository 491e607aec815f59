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
from .errors import ConflictError, MissingError, NoStreamError, SignatureError, TransportError
from .follower import Follower, StepUpdate
from .inventory import StepInfo, StreamStatus, status
from .mirror import Mirror, MirrorResult
from .objects import MAJOR as STREAM_MAJOR
from .objects import MINOR as STREAM_MINOR
from .prune import PruneResult, prune
from .publisher import CommitResult, Publisher, PublishResult
from .ranges import FetchStats

STREAM_VERSION = (STREAM_MAJOR, STREAM_MINOR)

__all__ = ["Publisher", "Follower", "StepUpdate", "Mirror", "MirrorResult", "PublishResult", "CommitResult",
           "FetchStats", "ConflictError", "MissingError", "SignatureError", "TransportError", "STREAM_VERSION"]
__all__ += ["NoStreamError"]
__all__ += ["status", "StreamStatus", "StepInfo", "prune", "PruneResult"]   # retention (S16)
