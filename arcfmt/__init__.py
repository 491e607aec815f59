"""arcfmt: lossless weight deltas for RL weight sync — a versioned binary format (SPEC.md).

A delta rebuilds a model's new weights bit-exactly from its previous ones at a small fraction of their
size; every tensor is verified against a hash and the whole model against a digest. Arrays are numpy
(ml_dtypes for BF16/FP8) or torch tensors, name → array; torch in gives torch out.

Tensors in memory
    delta = arcfmt.encode(base, target, base_step=3, target_step=4)   # bytes
    target = arcfmt.decode(base, delta)                                # verified, bit-exact
  ``keyframe=True`` (or ``base=None``) stores a full snapshot. A target tensor with no base tensor of
  the same name, dtype and shape is stored whole: ``encode`` warns (``KeyframeWarning``), or refuses
  with ``on_mismatch="error"``.

Checkpoints on disk (a .safetensors file or a sharded folder; what the ``arcfmt`` command runs)
    arcfmt.encode_files("step3/", "step4/", "4.arc", base_step=3, target_step=4)
    arcfmt.apply_files("step3/", "4.arc", "step4-rebuilt/")     # or in_place=True
  All or nothing: the output appears (one atomic rename) only once it has verified.

One delta file: random access, streams, writing
    with open("4.arc", "rb") as f:                   # or bytes, or an fsspec file (range reads)
        r = arcfmt.DeltaReader(f)
        r.names, r.header("w").shape, r.decode("w", base)   # one tensor, verified
    for name, arr in arcfmt.StreamReader(pipe, base): ...   # front to back, never seeks
    with arcfmt.DeltaWriter(out, base_step=3, target_step=4) as w:
        w.write_tensors((n, base.get(n), t) for n, t in target.items())

Live engines and object storage
    for name, t in arcfmt.apply_in_place(live_weights, delta): ...   # patched in place, verified first
  ``arcfmt.store`` streams steps through S3, GCS or any fsspec store: ``Publisher`` on the trainer,
  ``Follower`` on each rollout worker (into a folder, or ``live=`` weights), ``Mirror`` per region;
  ``arcfmt.torch`` has the torch helpers (``load_checkpoint``, ``apply_sparse``).

Errors
  Every bad input or failed check raises a subclass of ``ArcError``, with the ``category`` of SPEC.md
  §15: ``FormatError`` (not a valid file: ``ChecksumError``, ``TruncatedError``, ...),
  ``WrongBaseError`` (a delta for another base; ``MissingPreviousError``: one written with the previous
  step, which was not given), ``VerificationError`` (a rebuilt tensor failed its
  hash), ``InputError`` (a caller's mistake; ``MissingTensorError`` is also a ``KeyError``) and
  ``FileAccessError`` (an OS error, naming the path).

First use
  The ctx-delta kernels compile once per install (numba caches them; 15-25 s on 2 cores). The first
  call that needs them warns (``FirstCompileWarning``); ``arcfmt.warm_up()`` or ``arcfmt warm-up``
  at install or image-build time compiles them all beforehand.

More: README.md (a tour, the command line, streams), SPEC.md (Part I the file format, Part II streams),
``help(arcfmt.store)``. ``FORMAT_VERSION`` is the version files are written in.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    ArcError,
    BadMagicError,
    ChecksumError,
    CorruptError,
    FileAccessError,
    FormatError,
    InputError,
    LimitError,
    MissingPreviousError,
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

__version__ = "0.1.0"                 # the one place (pyproject.toml reads it: [tool.setuptools.dynamic])

# Everything else is imported when first used (PEP 562): ``import arcfmt`` (and the ``arcfmt`` command,
# whose module imports the package first) costs no numpy, numba or store import, so a Ctrl-C or a
# ``--help`` in the first second meets the command's own handling, not a traceback from an import.
_LAZY = dict(
    encode="api", decode="api", apply_in_place="api", encode_files="api", apply_files="api",
    DeltaReader="reader", StreamReader="reader", BufferSource="reader", FileSource="reader",
    DeltaWriter="writer", KeyframeWarning="writer", Publisher="store", Follower="store",
    warm_up="encodings.ctx_delta", FirstCompileWarning="backend", History="history",
)

if TYPE_CHECKING:
    from .api import apply_files, apply_in_place, decode, encode, encode_files
    from .backend import FirstCompileWarning
    from .encodings.ctx_delta import warm_up
    from .history import History
    from .reader import BufferSource, DeltaReader, FileSource, StreamReader
    from .store import Follower, Publisher
    from .writer import DeltaWriter, KeyframeWarning

    FORMAT_VERSION: tuple[int, int]


def _format_version() -> tuple[int, int]:   # the version every file is written as (SPEC.md §16)
    from .layout import MAJOR, MINOR
    return (MAJOR, MINOR)


if not TYPE_CHECKING:   # type checkers see the imports above, and an unknown name stays an error
    from .lazy import module_attributes

    __getattr__, __dir__ = module_attributes(__name__, _LAZY, {"FORMAT_VERSION": _format_version})
    del module_attributes


def main() -> int:
    """The ``arcfmt`` command (console script and ``python -m arcfmt``): the command's module is
    imported here, where a Ctrl-C during the import is one line and 130 like any other."""
    try:
        from .cli import main as command
    except KeyboardInterrupt:
        import sys
        print("arcfmt: interrupted", file=sys.stderr)
        return 130
    return command()


__all__ = [
    "encode", "decode", "apply_in_place", "encode_files", "apply_files", "KeyframeWarning",
    "warm_up", "FirstCompileWarning",
    "Publisher", "Follower", "DeltaWriter", "DeltaReader", "StreamReader",
    "BufferSource", "FileSource", "ArcError", "FormatError",
    "BadMagicError", "UnsupportedVersionError", "TruncatedError", "ChecksumError", "ReservedBitsError",
    "LimitError", "UnknownRecordError", "UnsupportedError", "CorruptError", "WrongBaseError",
    "VerificationError", "InputError", "SafetensorsError", "FileAccessError", "MissingTensorError",
    "MissingPreviousError", "History", "FORMAT_VERSION", "__version__",
]
