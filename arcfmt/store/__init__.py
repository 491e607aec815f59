"""Delta streams over object storage (SPEC.md Part II): trainer shards publish, rollout regions follow.

    from arcfmt.store import Publisher, Follower
    Publisher("s3://bucket/run42", shard=3, num_shards=8).publish(17, tensors)
    for update in Follower("s3://bucket/run42", into="/models/run42").follow():
        engine.load_weights(update.weights())

Any fsspec URL works: local paths, ``s3://`` (s3fs), ``gs://``/``gcs://`` (gcsfs), ``memory://``.

Modules: ``publisher`` and ``follower`` (the two sides), ``objects`` (the JSON objects: head,
manifest, descriptor), ``names`` (object names, checked), ``backends`` (one adapter class per kind
of store, and ``Store``, a stream root's objects), ``ranges`` (bounded range reads, the spool),
``retry`` (the one retry layer, deadlines), ``errors``.
"""
from .errors import ConflictError, MissingError, TransportError
from .follower import Follower, StepUpdate
from .objects import MAJOR as STREAM_MAJOR
from .objects import MINOR as STREAM_MINOR
from .publisher import CommitResult, Publisher, PublishResult
from .ranges import FetchStats

STREAM_VERSION = (STREAM_MAJOR, STREAM_MINOR)

__all__ = ["Publisher", "Follower", "StepUpdate", "PublishResult", "CommitResult", "FetchStats", "ConflictError",
           "MissingError", "TransportError", "STREAM_VERSION"]
