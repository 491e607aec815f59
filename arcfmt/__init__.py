"""arcfmt: lossless weight deltas for RL weight sync — a versioned binary format (SPEC.md)."""
from .api import apply_in_place, decode, encode
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
from .writer import DeltaWriter

__version__ = "0.1.0"                 # the one place (pyproject.toml reads it: [tool.setuptools.dynamic])
FORMAT_VERSION = (_MAJOR, _MINOR)     # the version every file is written as (SPEC.md §16)

__all__ = [
    "encode", "decode", "apply_in_place", "Publisher", "Follower", "DeltaWriter", "DeltaReader", "StreamReader",
    "BufferSource", "FileSource", "ArcError", "FormatError",
    "BadMagicError", "UnsupportedVersionError", "TruncatedError", "ChecksumError", "ReservedBitsError",
    "LimitError", "UnknownRecordError", "UnsupportedError", "CorruptError", "WrongBaseError",
    "VerificationError", "InputError", "SafetensorsError", "FileAccessError", "MissingTensorError",
    "FORMAT_VERSION", "__version__",
]
