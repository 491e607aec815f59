"""Records of SPEC.md §4–§11: framing, checks and the typed payloads, built and parsed through layout."""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
import xxhash

from . import codecs, encodings
from . import layout as L
from .dtypes import DType, from_code
from .errors import (
    ArcError,
    BadMagicError,
    ChecksumError,
    CorruptError,
    InputError,
    LimitError,
    ReservedBitsError,
    TruncatedError,
    UnknownRecordError,
    UnsupportedError,
    UnsupportedVersionError,
)
from .integrity import record_checksum
from .layout import BytesLike

KNOWN_CRITICAL = {L.META, L.TENS, L.BLCK, L.INDX}
_CONTROL_RE = re.compile(rb"[\x00-\x1f\x7f]")


# ------------------------------------------------------------------------------------ header/trailer

def header_flags(compact_index: bool = True, inline_blocks: bool = True) -> int:
    """The header's (and the trailer's) flags: INLINE_BLOCKS only with COMPACT_INDEX (§4)."""
    return (L.COMPACT_INDEX | (L.INLINE_BLOCKS if inline_blocks else 0)) if compact_index else 0


def build_header(flags: int) -> bytes:
    out: bytes = L.FileHeader.build(dict(magic=L.MAGIC, major=L.MAJOR, minor=L.MINOR, flags=flags))
    return out


class FileHead(NamedTuple):
    """A checked file header (§4): the version, whether the index is compact (§10.1) and whether
    one-block tensors carry their block (§7)."""
    major: int
    minor: int
    compact_index: bool
    inline_blocks: bool = False

    @property
    def version(self) -> tuple[int, int]:
        return self.major, self.minor


def _check_flags(flags: int, where: str, inline_needs_compact: bool = True) -> None:
    """The flag checks of the header (§4): reserved bits, then INLINE_BLOCKS without COMPACT_INDEX; a
    trailer's (§11) reserved bits only, unless it is read without its header (S9.3)."""
    if flags & ~L.HEADER_FLAGS:
        raise ReservedBitsError(f"{where} flags 0x{flags:08x}: reserved bits 0x{flags & ~L.HEADER_FLAGS:08x} "
                                f"must be zero")
    if inline_needs_compact and flags & L.INLINE_BLOCKS and not flags & L.COMPACT_INDEX:
        raise CorruptError(f"{where} flags 0x{flags:08x}: INLINE_BLOCKS is only defined with COMPACT_INDEX")


def check_header(data: BytesLike) -> FileHead:
    if len(data) < L.HEADER_SIZE:
        if bytes(data[:len(L.MAGIC)]) == L.MAGIC[:len(data)]:
            raise TruncatedError(f"file ends inside the {L.HEADER_SIZE}-byte header (at byte {len(data)})")
        raise BadMagicError("not an arcfmt file (bad magic)")
    h = L.parse_file_header(data)
    if h.magic != L.MAGIC:
        raise BadMagicError(f"not an arcfmt file: magic {h.magic!r} at offset 0")
    if h.major != L.MAJOR:
        raise UnsupportedVersionError(f"format version {h.major}.{h.minor}: this decoder reads major version {L.MAJOR}")
    _check_flags(h.flags, "header (offset 12)")
    return FileHead(h.major, h.minor, bool(h.flags & L.COMPACT_INDEX), bool(h.flags & L.INLINE_BLOCKS))


def build_trailer(index_offset: int, index_size: int, flags: int) -> bytes:
    fields = dict(index_offset=index_offset, index_size=index_size, major=L.MAJOR, minor=L.MINOR,
                  flags=flags, checksum=0, magic=L.TRAILER_MAGIC)
    fields["checksum"] = record_checksum(L.Trailer.build(fields)[:L.TRAILER_CHECKED_SIZE], b"")
    out: bytes = L.Trailer.build(fields)
    return out


class TrailerFields(Protocol):
    """A parsed ``Trailer`` (§11), as :func:`check_trailer` returns it."""
    index_offset: int
    index_size: int
    major: int
    minor: int
    flags: int
    checksum: int
    magic: bytes


def trailer_agrees(t: TrailerFields, header: FileHead) -> None:
    """§11's last checks: the trailer's version, COMPACT_INDEX and INLINE_BLOCKS bits are the header's
    (``corrupt``)."""
    if (t.major, t.minor) != header.version:
        raise CorruptError(f"header says version {header.major}.{header.minor}, trailer {t.major}.{t.minor}")
    for bit, name, mine in ((L.COMPACT_INDEX, "COMPACT_INDEX", header.compact_index),
                            (L.INLINE_BLOCKS, "INLINE_BLOCKS", header.inline_blocks)):
        if bool(t.flags & bit) != mine:
            raise CorruptError(f"the header's {name} bit is {int(mine)}, the trailer's {int(not mine)}")


def check_trailer(data: BytesLike, file_size: int, alone: bool = False) -> TrailerFields:
    """§11's checks of the last 40 bytes; ``alone``: read without the file's header (a follower's tail,
    S9.3), so INLINE_BLOCKS without COMPACT_INDEX, which no header can agree with, is refused here."""
    t: TrailerFields = L.parse_trailer(data)
    if t.magic != L.TRAILER_MAGIC:
        raise TruncatedError(f"no trailer at offset {file_size - L.TRAILER_SIZE}: the file is truncated or damaged")
    if record_checksum(bytes(data[:L.TRAILER_CHECKED_SIZE]), b"") != t.checksum:
        raise ChecksumError(f"trailer checksum mismatch at offset {file_size - L.TRAILER_SIZE}")
    if t.major != L.MAJOR:
        raise UnsupportedVersionError(
            f"trailer says format version {t.major}.{t.minor}; this decoder reads major {L.MAJOR}")
    _check_flags(t.flags, "trailer", inline_needs_compact=alone)   # else the header comparison finds it (§11)
    if t.index_offset < L.FIRST_RECORD_OFFSET or t.index_offset + t.index_size != file_size - L.TRAILER_SIZE:
        raise CorruptError(f"trailer points at an index [{t.index_offset}, +{t.index_size}) that does not end "
                           f"where the trailer starts ({file_size - L.TRAILER_SIZE})")
    if t.index_size < L.RECORD_HEADER_SIZE:
        raise CorruptError(f"index size {t.index_size} is smaller than a record header")
    return t


# ------------------------------------------------------------------------------------------ records

def build_record(rtype: bytes, payload: BytesLike) -> bytes:
    if len(payload) > L.MAX_RECORD_PAYLOAD:
        raise LimitError(f"record payload of {len(payload)} bytes exceeds {L.MAX_RECORD_PAYLOAD}")
    return L.frame_record(rtype, payload, record_checksum)


@dataclass
class RecordHead:
    type: bytes
    length: int
    checksum: int

    @property
    def critical(self) -> bool:
        return L.is_critical(self.type)


def parse_record_head(data: BytesLike, offset: int) -> RecordHead:
    """Check a 16-byte record header: type letters and payload limit (SPEC.md §5)."""
    h = L.parse_record_header(data)
    if not h.type.isalpha():  # bytes.isalpha: ASCII letters only, as RECORD_TYPE_RE (4 bytes by the layout)
        raise CorruptError(f"record at offset {offset}: type {h.type!r} is not four ASCII letters")
    if h.length > L.MAX_RECORD_PAYLOAD:
        raise LimitError(f"record {h.type.decode()} at offset {offset}: payload of {h.length} bytes "
                         f"exceeds MAX_RECORD_PAYLOAD ({L.MAX_RECORD_PAYLOAD})")
    return RecordHead(h.type, h.length, h.checksum)


def verify_record(head: RecordHead, head_bytes: BytesLike, payload: BytesLike, offset: int) -> None:
    if record_checksum(bytes(head_bytes[:L.RECORD_CHECKED_SIZE]), payload) != head.checksum:
        raise ChecksumError(f"record {head.type.decode()} at offset {offset}: checksum mismatch")
    if head.critical and head.type not in KNOWN_CRITICAL:
        raise UnknownRecordError(f"record at offset {offset}: unknown critical record type {head.type.decode()!r}")


# --------------------------------------------------------------------------------------------- META

@dataclass
class Meta:
    base_step: int | None
    target_step: int | None
    prefixed_names: bool = False   # PREFIXED_NAMES (1.3): TENS names share the previous one's first bytes
    history: bool = False   # HISTORY (1.9): TENS records may carry HISTORY and previous_hash (§6, §7)

    def prev_name(self, entries: Sequence[IndexEntry], t: int) -> bytes | None:
        """What :func:`parse_tensor` takes as ``prev`` for tensor ``t``, given the entries (index
        entries, or those of the tensors read so far) of the tensors before it, in file order."""
        if not self.prefixed_names:
            return None
        return entries[t - 1].name.encode("utf-8") if t else b""


def build_meta(meta: Meta) -> bytes:
    out: bytes = L.MetaPayload.build(dict(
        flags=(L.PREFIXED_NAMES if meta.prefixed_names else 0) | (L.META_HISTORY if meta.history else 0),
        base_step=L.NO_STEP if meta.base_step is None else meta.base_step,
        target_step=L.NO_STEP if meta.target_step is None else meta.target_step))
    return out


def parse_meta(payload: BytesLike) -> Meta:
    if len(payload) != L.META_PAYLOAD_SIZE:
        raise CorruptError(f"META payload is {len(payload)} bytes, {L.META_PAYLOAD_SIZE} expected")
    m = L.parse_meta_payload(payload)
    if m.flags & ~L.META_FLAGS:
        raise ReservedBitsError(f"META flags 0x{m.flags:08x}: reserved bits must be zero")
    return Meta(None if m.base_step == L.NO_STEP else m.base_step,
                None if m.target_step == L.NO_STEP else m.target_step, bool(m.flags & L.PREFIXED_NAMES),
                bool(m.flags & L.META_HISTORY))


# --------------------------------------------------------------------------------------------- names

# Names a safetensors header cannot hold as a tensor: the key safetensors reserves (SPEC.md §7).
RESERVED_NAMES = frozenset({b"__metadata__"})


def _name_problem(name: bytes) -> tuple[type[ArcError], str] | None:
    """What is wrong with a tensor name's bytes (SPEC.md §7), as (error class, reason); None if valid."""
    if not name:
        return CorruptError, "empty tensor name"
    if len(name) > L.MAX_NAME_BYTES:
        return LimitError, f"tensor name of {len(name)} bytes exceeds MAX_NAME_BYTES ({L.MAX_NAME_BYTES})"
    try:
        text = name.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        return CorruptError, f"tensor name is not valid UTF-8 ({exc.reason} at byte {exc.start})"
    if _CONTROL_RE.search(name):
        return CorruptError, f"tensor name {text!r} contains a control character"
    if name in RESERVED_NAMES:
        return CorruptError, f"tensor name {text!r} is reserved (a safetensors header cannot hold it)"
    return None


def check_name(name: bytes, where: str) -> str:
    """A name read from a file or stream object: CorruptError / LimitError when it breaks SPEC.md §7."""
    problem = _name_problem(name)
    if problem is not None:
        cls, reason = problem
        raise cls(f"{where}: {reason}")
    return name.decode("utf-8")


def check_input_name(name: object, where: str | None = None) -> bytes:
    """A name given by a caller (writer, encode): its UTF-8 bytes, or InputError when it is not a str or
    breaks SPEC.md §7 (a caller's mistake, not damaged input)."""
    at = f"{where}: " if where else ""
    if not isinstance(name, str):
        raise InputError(f"{at}tensor names must be str, got {type(name).__name__}")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{at}tensor name {name!r} is not valid Unicode text "
                         f"({exc.reason} at index {exc.start})") from None
    problem = _name_problem(raw)
    if problem is not None:
        raise InputError(f"{at}{problem[1]}")
    return raw


def element_count(dims: Sequence[int], where: str) -> int:
    """The element count of a shape (SPEC.md §7): LimitError unless the product of the non-zero dims,
    checked after every factor, stays within MAX_TENSOR_ELEMS; 0 when a dimension is 0."""
    nonzero = 1
    zero = False
    for d in dims:
        if d == 0:
            zero = True
            continue
        nonzero *= d
        if nonzero > L.MAX_TENSOR_ELEMS:
            raise LimitError(f"{where}: the dimensions {_short_dims(dims)} multiply to more than "
                             f"MAX_TENSOR_ELEMS ({L.MAX_TENSOR_ELEMS}), zero dimensions left out")
    return 0 if zero else nonzero


def _short_dims(dims: Iterable[int]) -> str:
    dl = list(dims)
    return str(dl) if len(dl) <= 16 else f"{dl[:16]}..."


# --------------------------------------------------------------------------------------------- TENS

@dataclass
class TensorHeader:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    block_elems: int
    base_hash: int | None  # None: the tensor needs no base
    target_hash: int
    previous_hash: int | None = None   # HISTORY (1.9, §7): the tensor needs its previous step, of this hash

    # Computed once, as plain attributes: the pipeline reads them per block, and a header never changes
    # once made (functools.cached_property takes a lock per first read on Python 3.11).
    size: int = field(init=False, repr=False, compare=False)
    block_count: int = field(init=False, repr=False, compare=False)
    # where its inline block starts in the TENS payload (INLINE_BLOCKS and one block, §7); else None
    inline_at: int | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = 1
        for d in self.shape:
            n *= d
        self.size = n
        self.block_count = -(-n // self.block_elems)

    @property
    def needs_base(self) -> bool:
        return self.base_hash is not None

    @property
    def needs_history(self) -> bool:
        return self.previous_hash is not None

    def block_range(self, b: int) -> tuple[int, int]:
        start = b * self.block_elems
        return start, min(self.size, start + self.block_elems)

    def block_len(self, b: int) -> int:
        s, e = self.block_range(b)
        return e - s


def build_tensor(h: TensorHeader, prev: bytes | None = None, inline: bytes | None = None) -> bytes:
    """``prev``: the previous tensor's name (b"" for the first) in a file with PREFIXED_NAMES;
    ``inline``: its only block (:func:`build_block` without ordinals), carried in the record (§7)."""
    flags = ((L.NEEDS_BASE if h.needs_base else 0) | (L.INLINE_BLOCK if inline is not None else 0)
             | (L.TENS_HISTORY if h.needs_history else 0))
    fields = L.build_tensor_payload(h.name.encode("utf-8"), h.dtype.code, h.shape, h.block_elems, flags,
                                    h.base_hash, h.target_hash, prev, h.previous_hash)
    return fields if inline is None else fields + inline


def parse_tensor(payload: BytesLike, where: str, prev: bytes | None = None,
                 inline_blocks: bool = False, history: bool = False) -> TensorHeader:
    """A checked TENS record (§7). ``prev``: the previous tensor's name (b"" for the first) in a file
    whose META has PREFIXED_NAMES, None in one without (see :meth:`Meta.prev_name`). ``inline_blocks``:
    the header has INLINE_BLOCKS: a tensor with the flag INLINE_BLOCK ends in its only block
    (``inline_at``), checked by :func:`parse_block` once the caller has compared the record with the
    index (§7, §10). ``history``: the file's META has HISTORY (1.9), which defines the flag HISTORY."""
    t = L.parse_tensor_payload(payload, f"{where}: TENS", prev, history)
    defined = L.NEEDS_BASE | (L.INLINE_BLOCK if inline_blocks else 0) | (L.TENS_HISTORY if history else 0)
    inline = bool(t.flags & defined & L.INLINE_BLOCK)
    if not inline and t._end != len(payload):
        raise CorruptError(f"{where}: TENS payload has {len(payload) - t._end} bytes left over")
    name = check_name(t.name, where)
    if t.flags & ~defined:
        raise ReservedBitsError(f"{where}: TENS flags 0x{t.flags:02x}: reserved bits must be zero")
    if t.previous_hash is not None and t.base_hash is None:   # R-TENS-HISTORY
        raise CorruptError(f"{where}: tensor {name!r} needs its previous step (HISTORY) but no base")
    dt = from_code(t.dtype)
    element_count(t.dims, f"{where}: tensor {name!r}")
    if t.block_elems == 0:
        raise CorruptError(f"{where}: tensor {name!r} has block_elems 0")
    if t.block_elems > L.MAX_BLOCK_ELEMS:
        raise LimitError(f"{where}: block_elems {t.block_elems} exceeds MAX_BLOCK_ELEMS ({L.MAX_BLOCK_ELEMS})")
    h = TensorHeader(name, dt, tuple(t.dims), t.block_elems, t.base_hash, t.target_hash, t.previous_hash)
    if h.block_count > L.MAX_BLOCKS_PER_TENSOR:
        raise LimitError(f"{where}: tensor {name!r} has {h.block_count} blocks, more than MAX_BLOCKS_PER_TENSOR")
    if inline:
        if h.block_count != 1:   # R-INLINE.COUNT
            raise CorruptError(f"{where}: tensor {name!r} has {h.block_count} blocks; INLINE_BLOCK needs one")
        h.inline_at = t._end
    return h


# --------------------------------------------------------------------------------------------- BLCK

@dataclass
class StreamInfo:
    codec: int
    stored: int
    decoded: int


@dataclass
class BlockInfo:
    tensor: int
    block: int
    encoding: int
    params: list[int]
    streams: list[StreamInfo] = field(default_factory=list)
    data_offset: int = 0  # where the stream data starts within the payload

    @property
    def changed(self) -> int | None:
        return encodings.get(self.encoding).changed(self.params)


def build_block(tensor: int | None, block: int | None, enc: encodings.EncodedBlock,
                coded: Sequence[tuple[int, BytesLike]], head: bytes | None = None) -> bytes:
    """``coded``: one ``(codec, stored_bytes)`` per stream; ``tensor`` and ``block`` None: an inline
    block (§7), to follow its TENS fields. ``head``: :func:`block_head` of the same, when the caller has it."""
    if head is None:
        head = block_head(tensor, block, enc, coded)
    return b"".join([head] + [bytes(s) for _, s in coded])


def block_head(tensor: int | None, block: int | None, enc: encodings.EncodedBlock,
               coded: Sequence[tuple[int, BytesLike]]) -> bytes:
    """The head of :func:`build_block`'s payload (its stream data follows)."""
    return L.build_block_head(tensor, block, enc.encoding, enc.params, [(c, len(s)) for c, s in coded])


def parse_block(payload: BytesLike, th: TensorHeader, tensor: int, block: int, where: str,
                expected_encoding: int | None = None) -> BlockInfo:
    """Parse and check a BLCK header and stream table against the tensor it belongs to; with
    ``th.inline_at`` set, ``payload`` is the tensor's TENS payload and the block is the one it ends
    in (§7: no ordinals to check, the data runs to the payload's end)."""
    m = th.block_len(block)
    dt = th.dtype
    found: list[Any] = []   # the block's encoding (looked up and checked once), then its stream lengths

    def param_count(encoding: int, head: list[int]) -> int:
        if not head:
            enc = encodings.get(encoding)
            enc.check_dtype(dt)
            found.append(enc)
        n: int = found[0].param_count(head)
        return n

    def stream_count(encoding: int, params: list[int]) -> int:
        lengths = found[0].stream_lengths(dt, params, m)
        found.append(lengths)
        return len(lengths)

    inline = th.inline_at is not None
    try:
        head = L.parse_block_head(payload, "BLCK", param_count, stream_count,
                                  *((th.inline_at, False) if th.inline_at is not None else ()))
    except ArcError as exc:
        raise type(exc)(f"{where}: {exc}") from None
    if not inline and (head.tensor != tensor or head.block != block):
        raise CorruptError(f"{where}: BLCK is for tensor {head.tensor} block {head.block}, "
                           f"expected tensor {tensor} block {block}")
    if expected_encoding is not None and head.encoding != expected_encoding:
        raise CorruptError(f"{where}: encoding {head.encoding} differs from the index ({expected_encoding})")
    enc, lengths = found
    if enc.needs_base and not th.needs_base:
        raise CorruptError(f"{where}: encoding {enc.name} needs a base, "
                           f"but tensor {th.name!r} has none")
    if enc.needs_history and not th.needs_history:   # R-CTXRH-TENSOR
        raise CorruptError(f"{where}: encoding {enc.name} needs the previous step, "
                           f"but tensor {th.name!r} does not carry HISTORY")
    streams = []
    total = 0
    for (codec, length), dec_len in zip(head.streams, lengths):
        if codecs.find(codec) is None:
            raise UnsupportedError(f"{where}: unknown codec id {codec}")
        streams.append(StreamInfo(codec, length, dec_len))
        total += length
    if head._end + total != len(payload):
        raise CorruptError(f"{where}: BLCK streams hold {total} bytes but the payload has "
                           f"{len(payload) - head._end} after the stream table")
    return BlockInfo(tensor, block, head.encoding, head.params, streams, head._end)


def decode_block_streams(payload: BytesLike, info: BlockInfo, where: str | None = None) -> list[BytesLike]:
    """A loaded block's streams, decoded; a corrupt or over-limit stream's error names it, after
    ``where`` (the block, when the caller has its name made; else the caller adds it)."""
    out = []
    pos = info.data_offset
    mv = memoryview(payload)
    for k, s in enumerate(info.streams):
        try:
            out.append(codecs.decode(s.codec, mv[pos: pos + s.stored], s.decoded))
        except (CorruptError, LimitError) as exc:
            raise type(exc)(f"stream {k}: {exc}" if where is None else f"{where}: stream {k}: {exc}") from None
        pos += s.stored
    return out


# --------------------------------------------------------------------------------------------- INDX

@dataclass
class BlockRef:
    offset: int
    size: int
    checksum: int | None   # None: a compact index lists none (§10.1)
    encoding: int


@dataclass
class IndexEntry:
    name: str
    tens_offset: int
    tens_size: int
    tens_checksum: int | None   # None: a compact index lists none (§10.1)
    blocks: list[BlockRef]


@dataclass
class OtherRecord:
    offset: int
    size: int
    type: bytes


@dataclass
class Index:
    base_digest: bytes
    target_digest: bytes
    entries: list[IndexEntry]  # file order
    others: list[OtherRecord] = field(default_factory=list)  # every record that is not META/TENS/BLCK/INDX
    compact: bool = False      # laid out without offsets and checksums (header flag COMPACT_INDEX, §10.1)
    inline_blocks: bool = False   # one-block tensors carry their block, listed with size 0 (INLINE_BLOCKS, §7)
    # what it was parsed from (parse_index): the INDX record's offset and the xxh3-64 of its payload, so
    # a reader handed this index can tell it is the one its own bytes give (DeltaReader(index=))
    source: tuple[int, int] | None = None

    def parsed_from(self, payload: BytesLike, index_offset: int, compact: bool, inline_blocks: bool) -> bool:
        """Whether :func:`parse_index` gave this index for these very arguments."""
        return (self.source is not None and (self.compact, self.inline_blocks) == (compact, inline_blocks)
                and self.source == (index_offset, xxhash.xxh3_64_intdigest(payload)))


def build_index(index: Index) -> bytes:
    names = [e.name.encode("utf-8") for e in index.entries]
    blocks = [b for e in index.entries for b in e.blocks]
    body = L.index_body(index.compact).build(dict(
        base_digest=index.base_digest, target_digest=index.target_digest,
        tensor_count=len(index.entries), block_count=len(blocks),
        name_lengths=[len(n) for n in names], names=b"".join(names),
        tens_offsets=[e.tens_offset for e in index.entries], tens_sizes=[e.tens_size for e in index.entries],
        tens_checksums=[e.tens_checksum for e in index.entries],
        tens_block_counts=[len(e.blocks) for e in index.entries],
        blk_offsets=[b.offset for b in blocks], blk_sizes=[b.size for b in blocks],
        blk_checksums=[b.checksum for b in blocks], blk_encodings=[b.encoding for b in blocks],
        other_count=len(index.others), other_offsets=[o.offset for o in index.others],
        other_sizes=[o.size for o in index.others], other_types=[o.type for o in index.others]))
    codec, stored = codecs.encode_smallest(body, "fast")
    out: bytes = L.IndexPayload.build(dict(codec=codec, body_length=len(body), body=stored))
    return out


def index_body_length(payload: BytesLike) -> int:
    """The body length an INDX payload gives (§10): what MAX_INDEX_BYTES bounds (a writer checks it)."""
    return int(L.parse(L.IndexPayload, bytes(payload), "INDX").body_length)


def parse_index(payload: BytesLike, index_offset: int, compact: bool = False, inline_blocks: bool = False) -> Index:
    """The index (§10) of a file whose INDX record is at ``index_offset``; ``compact``: the header has
    COMPACT_INDEX, and the TENS and BLCK offsets are derived from the sizes (§10.1); ``inline_blocks``:
    it has INLINE_BLOCKS too, and a one-block tensor's block has size 0 and its TENS record's offset."""
    where = f"INDX at offset {index_offset}"
    p = L.parse(L.IndexPayload, bytes(payload), where)
    if p.body_length > L.MAX_INDEX_BYTES:
        raise LimitError(f"{where}: index body of {p.body_length} bytes exceeds MAX_INDEX_BYTES ({L.MAX_INDEX_BYTES})")
    if p.codec not in codecs.NAMES:
        raise UnsupportedError(f"{where}: unknown codec id {p.codec}")
    body = bytes(codecs.decode(p.codec, p.body, p.body_length))
    b = L.parse(L.index_body(compact), body, where)
    if b._end != len(body):
        raise CorruptError(f"{where}: {len(body) - b._end} bytes left over after the index body")
    if b.name_lengths.size and int(b.name_lengths.max()) > L.MAX_NAME_BYTES:
        raise LimitError(f"{where}: a tensor name exceeds MAX_NAME_BYTES ({L.MAX_NAME_BYTES})")
    counts = b.tens_block_counts
    if sum(counts.tolist()) != b.block_count:  # exact: a uint64 sum could wrap to block_count
        raise CorruptError(f"{where}: per-tensor block counts do not add up to {b.block_count}")
    if counts.size and int(counts.max()) > L.MAX_BLOCKS_PER_TENSOR:
        raise LimitError(f"{where}: a tensor has more than MAX_BLOCKS_PER_TENSOR blocks")
    ends = np.cumsum(counts.astype(np.int64))
    starts = ends - counts.astype(np.int64)
    # File order: TENS(0), its blocks in order, TENS(1), ... (SPEC.md §3): each record's place in it
    T = b.tensor_count
    tens_pos = starts + np.arange(T, dtype=np.int64)
    owner = np.repeat(np.arange(T, dtype=np.int64), counts.astype(np.int64))
    blk_pos = np.arange(b.block_count, dtype=np.int64) + owner + 1
    # the blocks that have no record (§7): size 0, a one-block tensor's, with INLINE_BLOCKS (set with
    # COMPACT_INDEX); a size 0 elsewhere fails the size check (R-INLINE.SIZE)
    if inline_blocks:
        inline = (b.blk_sizes == 0) & (counts[owner] == 1)
    else:
        inline = np.zeros(b.block_count, bool)
    if compact:
        tens_offsets, blk_offsets = derive_offsets(b, tens_pos, blk_pos, index_offset, where, inline)
        blk_offsets[inline] = tens_offsets[owner[inline]]   # "inside" its TENS record, size 0
        tens_checksums: list[int | None] = [None] * b.tensor_count
        blk_checksums: list[int | None] = [None] * b.block_count
    else:
        check_tiling(b, index_offset, where)
        tens_offsets, blk_offsets = b.tens_offsets, b.blk_offsets
        tens_checksums, blk_checksums = b.tens_checksums.tolist(), b.blk_checksums.tolist()
    seq = np.empty(T + b.block_count, np.uint64)
    seq[tens_pos] = tens_offsets
    seq[blk_pos] = blk_offsets
    if inline.any():
        seq = np.delete(seq, blk_pos[inline])   # only records are in file order
    if seq.size > 1 and not (seq[1:] > seq[:-1]).all():
        raise CorruptError(f"{where}: tensors and blocks are not located in file order")
    if b.other_offsets.size > 1 and not (b.other_offsets[1:] > b.other_offsets[:-1]).all():
        raise CorruptError(f"{where}: the other records are not listed in file order")
    for t in b.other_types.tolist():
        if not L.RECORD_TYPE_RE.match(t):
            raise CorruptError(f"{where}: record type {t!r} is not four ASCII letters")
        if t in KNOWN_CRITICAL:
            raise CorruptError(f"{where}: a {t.decode()} record is listed among the other records")
        if L.is_critical(t):
            raise UnknownRecordError(f"{where}: the file holds a critical record of unknown type {t.decode()!r}")
    names = bytes(b.names)
    entries = []
    seen = set()
    pos = 0
    # every column as Python ints once (a numpy slice and tolist per tensor cost more than the rest)
    blk = list(map(BlockRef, blk_offsets.tolist(), b.blk_sizes.tolist(), blk_checksums,
                   b.blk_encodings.tolist()))
    bounds = zip(b.name_lengths.tolist(), starts.tolist(), ends.tolist(), tens_offsets.tolist(),
                 b.tens_sizes.tolist(), tens_checksums)
    # no control character in any name, none empty: each then needs only its UTF-8 and reserved checks
    plain = not _CONTROL_RE.search(names) and not (b.name_lengths == 0).any()
    text = names.decode("ascii") if plain and names.isascii() else None  # all ASCII: names are slices of it
    for t, (nl, s0, e0, to, ts, tc) in enumerate(bounds):
        raw = names[pos: pos + nl]
        name = None
        if plain and raw not in RESERVED_NAMES:
            if text is not None:
                name = text[pos: pos + nl]
            else:
                try:
                    name = raw.decode("utf-8")
                except UnicodeDecodeError:
                    pass
        pos += nl
        if name is None:   # check_name says what is wrong
            name = check_name(raw, f"{where}: entry {t}")
        if raw in seen:
            raise CorruptError(f"{where}: duplicate tensor name {name!r}")
        seen.add(raw)
        entries.append(IndexEntry(name, to, ts, tc, blk[s0:e0]))
    others = [OtherRecord(int(o), int(z), bytes(t)) for o, z, t in zip(
        b.other_offsets.tolist(), b.other_sizes.tolist(), b.other_types.tolist())]
    return Index(bytes(b.base_digest), bytes(b.target_digest), entries, others, compact, inline_blocks,
                 (index_offset, xxhash.xxh3_64_intdigest(payload)))


class IndexColumns(Protocol):
    """The columns of a parsed ``IndexBody`` (§10) that locate records (a construct Container)."""
    tens_offsets: np.ndarray
    tens_sizes: np.ndarray
    blk_offsets: np.ndarray
    blk_sizes: np.ndarray
    other_offsets: np.ndarray
    other_sizes: np.ndarray


def _check_sizes(sizes: np.ndarray, where: str) -> None:
    """§10 check 4: every located record's size lies in [16, 16 + MAX_RECORD_PAYLOAD]."""
    if (sizes < L.RECORD_HEADER_SIZE).any() or (sizes > L.RECORD_HEADER_SIZE + L.MAX_RECORD_PAYLOAD).any():
        raise CorruptError(f"{where}: a record size is out of range")



def derive_offsets(b: Any, tens_pos: np.ndarray, blk_pos: np.ndarray, index_offset: int,
                   where: str, inline: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The TENS and BLCK offsets of a compact index (§10.1), and its checks 4 and 5 (``tens_pos``,
    ``blk_pos``: each record's place in file order; ``inline``: the blocks without a record, of size 0,
    which the walk passes over — their offsets here mean nothing).

    The walk of §10.1 in closed form: in file order the located records' sizes add up to ``cum``;
    other record ``j`` is reached only where ``cum`` is exactly its offset less 52 and less the other
    records before it (``reach[j]``), at a place no earlier than the one before it; every located
    record is then shifted by the other records reached before it.
    """
    T, K = b.tensor_count, b.block_count
    sizes = np.empty(T + K, np.int64)   # the located records' sizes in file order
    sizes[tens_pos] = b.tens_sizes
    sizes[blk_pos] = b.blk_sizes
    other_sizes = b.other_sizes.astype(np.int64)
    located = sizes if inline is None or not inline.any() else np.delete(sizes, blk_pos[inline])
    _check_sizes(np.concatenate([located, other_sizes]), where)
    cum = np.zeros(T + K + 1, np.int64)   # at most ~2^26 records of at most ~2^28 bytes: no wrap
    np.cumsum(sizes, out=cum[1:])
    other_offsets = b.other_offsets
    if other_offsets.size and int(other_offsets.max()) > index_offset:
        raise CorruptError(f"{where}: an other record's offset lies past the index")
    before = np.zeros(other_sizes.size, np.int64)   # the other records' bytes before each one
    if other_sizes.size:
        np.cumsum(other_sizes[:-1], out=before[1:])
    reach = other_offsets.astype(np.int64) - L.FIRST_RECORD_OFFSET - before
    at = np.searchsorted(cum, reach)          # how many located records come before other record j
    found = (at <= T + K) & (cum[np.minimum(at, T + K)] == reach)
    if not found.all() or (at.size > 1 and (np.diff(at) < 0).any()):
        j = int(np.argmin(found)) if not found.all() else int(np.argmax(np.diff(at) < 0)) + 1
        raise CorruptError(f"{where}: other record {j} (offset {int(other_offsets[j])}) does not start where "
                           f"the records before it end (SPEC §10.1)")
    end = L.FIRST_RECORD_OFFSET + int(cum[-1]) + int(other_sizes.sum())
    if end != index_offset:
        raise CorruptError(f"{where}: the records it lists end at {end}, not at the index ({index_offset}) "
                           f"(SPEC §10.1)")
    # each located record moves by the other records reached at or before its place
    shift = np.zeros(T + K + 1, np.int64)
    np.add.at(shift, at, other_sizes)
    offsets = L.FIRST_RECORD_OFFSET + cum[:-1] + np.cumsum(shift)[:-1]
    return offsets[tens_pos].astype(np.uint64), offsets[blk_pos].astype(np.uint64)


def check_tiling(b: IndexColumns, index_offset: int, where: str) -> None:
    """The located records (TENS, BLCK, others) must cover [META end, index) exactly: no gap, no overlap."""
    offs = np.concatenate([b.tens_offsets, b.blk_offsets, b.other_offsets]).astype(np.uint64)
    sizes = np.concatenate([b.tens_sizes, b.blk_sizes, b.other_sizes]).astype(np.uint64)
    _check_sizes(sizes, where)
    order = np.argsort(offs, kind="stable")
    offs, sizes = offs[order], sizes[order]
    start = L.FIRST_RECORD_OFFSET
    expect = np.empty_like(offs)
    if offs.size:
        expect[0] = start
        np.add(offs[:-1], sizes[:-1], out=expect[1:])
    end = int(offs[-1] + sizes[-1]) if offs.size else start
    if (offs != expect).any() or end != index_offset:
        raise CorruptError(f"{where}: the records it locates do not tile the file between META and the index "
                           f"(a gap, an overlap, or an offset out of range)")
