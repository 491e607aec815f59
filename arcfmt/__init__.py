"""arcfmt: lossless weight deltas for RL weight sync — a versioned binary format (SPEC.md)."""
from .api import apply_in_place, decode, encode
from .errors import (
    ArcError, BadMagicError, ChecksumError, CorruptError, FileAccessError, FormatError, InputError, MissingTensorError, LimitError,
    ReservedBitsError, SafetensorsError, TruncatedError, UnknownRecordError, UnsupportedError,
    UnsupportedVersionError, VerificationError, WrongBaseError,
)
from .reader import BufferSource, DeltaReader, FileSource, StreamReader
from .store import Follower, Publisher
from .writer import DeltaWriter

__version__ = "0.1.0"
FORMAT_VERSION = (1, 0)

__all__ = [
    "encode", "decode", "apply_in_place", "Publisher", "Follower", "DeltaWriter", "DeltaReader", "StreamReader", "BufferSource", "FileSource", "ArcError", "FormatError",
    "BadMagicError", "UnsupportedVersionError", "TruncatedError", "ChecksumError", "ReservedBitsError",
    "LimitError", "UnknownRecordError", "UnsupportedError", "CorruptError", "WrongBaseError",
    "VerificationError", "InputError", "SafetensorsError", "FileAccessError", "MissingTensorError", "FORMAT_VERSION", "__version__",
]
