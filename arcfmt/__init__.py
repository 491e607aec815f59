"""arcfmt: lossless weight deltas for RL weight sync — a versioned binary format (SPEC.md).

A delta rebuilds a model's new weights bit-exactly from its previous ones, at a small fraction of
their size; every tensor is verified against a hash and the model against a digest. Arrays are numpy
(ml_dtypes for BF16/FP8) or torch tensors; torch in gives torch out.

Tensors in memory (name → array)::

    delta = arcfmt.encode(base, target, base_step=3, target_step=4)   # bytes
    target = arcfmt.decode(base, delta)                                # verified, bit-exact

    ``keyframe=True`` (or ``base=None``) stores a full snapshot. A tensor with no base of the same
    name, dtype and shape is stored whole: ``encode`` warns (``KeyframeWarning``), or refuses with
    ``on_mismatch="error"``.

Checkpoints on disk (safetensors file or sharded folder; what the ``arcfmt`` command line runs)::

    arcfmt.encode_files("step3/", "step4/", "4.arc", base_step=3, target_step=4)
    arcfmt.apply_files("step3/", "4.arc", "step4-rebuilt/")    # or in_place=True; all or nothing

One file, random access or a stream::

    r = arcfmt.DeltaReader(open("4.arc", "rb"))   # or bytes, or an fsspec file (range reads)
    r.names, r.header("w").shape, r.decode("w", base)       # one tensor, verified
    for name, arr in arcfmt.StreamReader(pipe, base): ...   # front to back, no seeking
    with arcfmt.DeltaWriter(f, base_step=3, target_step=4) as w: w.write_tensors(items)

Live engines: ``arcfmt.apply_in_place(live_weights, delta)`` patches the arrays an engine serves from
(yielding the ``(name, tensor)`` pairs ``load_weights`` takes); ``arcfmt.store`` streams steps through
object storage (``Publisher`` on the trainer, ``Follower`` on rollout workers, ``Mirror`` per
region); ``arcfmt.torch`` has the torch helpers (``load_checkpoint``, ``apply_sparse``).

Errors: every bad input or failed check raises a subclass of ``ArcError`` — ``FormatError`` (the
bytes are not a valid file; ``ChecksumError``, ``TruncatedError``…), ``WrongBaseError`` (the delta is
for another base), ``VerificationError`` (a rebuilt tensor failed its hash), ``InputError`` (a
caller's mistake), ``FileAccessError`` (an OS error, naming the path); each has the ``category`` of
SPEC.md §15. Nothing is written before it has been verified.

More: README.md (a tour, the command line, streams), SPEC.md (the format: Part I files, Part II
streams), ``help(arcfmt.store)``. ``FORMAT_VERSION`` is the version files are written in.
"""
from .api import apply_files, apply_in_place, decode, encode, encode_files
from .errors import (
    ArcError,
    BadMagicError,
    ChecksumError,
    CorruptError,
    FileAccessError,
    FormatError,
    InputError,
    LimitError,
    MissingTensorError,
    ReservedBitsError,
    SafetensorsError,
    TruncatedError,
    UnknownRecordError,
    UnsupportedError,
    UnsupportedVersionError,
    VerificationError,
    WrongBaseError,
)
from .layout import MAJOR as _MAJOR
from .layout import MINOR as _MINOR
from .reader import BufferSource, DeltaReader, FileSource, StreamReader
from .store import Follower, Publisher
from .writer import DeltaWriter, KeyframeWarning

__version__ = "0.1.0"                 # the one place (pyproject.toml reads it: [tool.setuptools.dynamic])
FORMAT_VERSION = (_MAJOR, _MINOR)     # the version every file is written as (SPEC.md §16)

__all__ = [
    "encode", "decode", "apply_in_place", "encode_files", "apply_files", "KeyframeWarning",
    "Publisher", "Follower", "DeltaWriter", "DeltaReader", "StreamReader",
    "BufferSource", "FileSource", "ArcError", "FormatError",
    "BadMagicError", "UnsupportedVersionError", "TruncatedError", "ChecksumError", "ReservedBitsError",
    "LimitError", "UnknownRecordError", "UnsupportedError", "CorruptError", "WrongBaseError",
    "VerificationError", "InputError", "SafetensorsError", "FileAccessError", "MissingTensorError",
    "FORMAT_VERSION", "__version__",
]
