"""Record surgery: take a valid arcfmt file apart into records, change it, put it back together.

The one toolkit for every crafted file — the must-reject tests (``tests/test_bad_input.py`` and others),
the conformance generator (``tools/make_vectors.py``) and the fuzzer (``tools/fuzz.py``). A crafted file
is a valid one changed in one place and reassembled with every *other* checksum, offset, index entry
(SPEC.md §10) and the trailer (§11) made consistent again, so that exactly the intended check fires.

    p = split(data)                      # header, records (META .. last record before INDX), index, trailer
    p.recs.insert(2, Rec(b"zzzz", b"x"))  # ... change records, or their fields ...
    bad = assemble(p)                    # fresh record checksums, index (digests kept) and trailer

Nothing here checks more than the framing; the helpers build bytes independently of arcfmt's own
writers where that matters (``varint`` is a plain LEB128 loop, the test of ``arcfmt.layout``'s fast
writer compares against it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import xxhash

from arcfmt import layout as L
from arcfmt import records
from arcfmt.integrity import record_checksum

__all__ = [
    "Rec", "Parts", "split", "parse_file", "assemble", "raw_record", "blck_encoding", "set_first_encoding",
    "tens_payload", "fix_trailer_checksum", "patch_trailer", "u64", "u32", "varint", "read_varint", "prefix_names",
    "FULL_INDEX_HEADER", "BLOCK_RECORDS_HEADER", "index_fields", "raw_index_payload", "tens_fields_end",
    "block_to_record",
]

# A valid file header without COMPACT_INDEX: ``assemble(p, header=FULL_INDEX_HEADER)`` writes the index
# with its offset and checksum columns (SPEC.md §10), for changes to those columns.
FULL_INDEX_HEADER = records.build_header(records.header_flags(compact_index=False))
# A valid header with COMPACT_INDEX but not INLINE_BLOCKS (1.5): ``assemble`` writes every block as a record.
BLOCK_RECORDS_HEADER = records.build_header(L.COMPACT_INDEX)

# ------------------------------------------------------------------------------------ integers


def u64(x: int) -> bytes:
    return int(x).to_bytes(8, "little")


def u32(x: int) -> bytes:
    return int(x).to_bytes(4, "little")


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The LEB128 integer at ``data[at:]`` and where it ends (no checks: valid files only)."""
    v = shift = 0
    while True:
        b = data[at]
        v |= (b & 0x7F) << shift
        at += 1
        shift += 7
        if not b & 0x80:
            return v, at


def prefix_names(p: Parts, recs: list) -> list:
    """``recs`` as a file with PREFIXED_NAMES has them (§6, §7, 1.3): the META flag set, each TENS name
    after the bytes it shares with the previous tensor's name — the previous record's ``name`` (the one
    the index lists), as random access reads it: a TENS name changed here without its ``Rec.name`` is
    joined in streaming onto the changed name. A TENS payload whose name field does not parse gets
    prefix length 0 in front of it, so that the fault it carries stays where it was."""
    out, prev = [], b""
    for r in recs:
        if r.raw is None and r.type == L.META and not out:
            r = replace(r, payload=u32(int.from_bytes(r.payload[:4], "little") | L.PREFIXED_NAMES) + r.payload[4:])
        elif r.raw is None and r.type == L.TENS:
            try:
                n, at = read_varint(r.payload, 0)
            except IndexError:
                n, at = len(r.payload) + 1, 0
            if at + n <= len(r.payload):
                name = r.payload[at:at + n]
                k = len(os.path.commonprefix((prev, name)))
                r = replace(r, payload=varint(k) + varint(n - k) + name[k:] + r.payload[at + n:])
            else:
                r = replace(r, payload=b"\x00" + r.payload)
            prev = (r.name or "").encode()
        out.append(r)
    return out


def varint(x: int) -> bytes:
    """Unsigned LEB128 (SPEC.md §3), written without arcfmt's code."""
    out = bytearray()
    while True:
        b = x & 0x7F
        x >>= 7
        if x:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


# ------------------------------------------------------------------------------------ records


def raw_record(rtype: bytes, payload: bytes, checksum: int | None = None) -> bytes:
    """A record's bytes (§5): type, length, checksum (``checksum`` forces a value, e.g. a wrong one), payload."""
    head8 = rtype + len(payload).to_bytes(4, "little")
    ck = record_checksum(head8, payload) if checksum is None else checksum
    return head8 + ck.to_bytes(8, "little") + payload


def blck_encoding(payload: bytes) -> int:
    """The encoding byte of a BLCK payload (after its two varints); 0 if the payload has none."""
    i = 0
    try:
        for _ in range(2):
            while payload[i] & 0x80:
                i += 1
            i += 1
        return payload[i]
    except IndexError:
        return 0


@dataclass
class Rec:
    """One record: its type and payload, and what :func:`assemble` needs to index it.

    ``offset``: where it was in the file it came from (-1 for a new record). ``name``: TENS, the tensor
    name the index lists (kept even if the payload is made unparsable). ``encoding``: BLCK, the encoding
    id the index lists; :func:`split` reads it from the payload, None reads it from the payload at
    assembly (so a changed payload's encoding byte goes into the index unless this is set). For a TENS
    record, the encoding of the inline block it carries (§7, 1.6; None: none), which the index lists
    with size 0.
    ``checksum``: force the record's checksum field (e.g. the checksum of other bytes). ``raw``: written
    verbatim instead of being built from type and payload; such a record is listed among the index's
    other records, never as a tensor or block. ``size``: its size in the file it came from (-1 for a new
    record; a TENS payload here may be longer than it was there, see :class:`Parts`).
    """

    type: bytes
    payload: bytes
    offset: int = -1
    name: str | None = None
    encoding: int | None = None
    checksum: int | None = None
    raw: bytes | None = None
    size: int = -1

    def bytes(self) -> bytes:
        return self.raw if self.raw is not None else raw_record(self.type, self.payload, self.checksum)


@dataclass
class Parts:
    """A file taken apart. ``recs``: every record in file order from META on; the INDX record too (last)
    only when parsed with ``keep_index=True`` (:func:`parse_file`) — :func:`assemble` always drops it and
    writes a fresh one. Names are whole in the TENS payloads here and META has no PREFIXED_NAMES
    (§6, 1.3), whatever the file had (``prefixed``): a change to a TENS payload is one of the §7 table,
    and :func:`assemble` writes the names as the file had them again (unless told otherwise)."""

    header: bytes
    recs: list
    index: records.Index
    index_payload: bytes
    trailer: bytes
    prefixed: bool = False

    def find(self, rtype: bytes) -> list:
        return [r for r in self.recs if r.type == rtype]


def split(data: bytes, *, keep_index: bool = False, block_records: bool = False) -> Parts:
    """Take a *valid* file apart into header, records, the parsed index and the trailer (framing only);
    ``block_records``: every inline block (§7) moved into a BLCK record, and the header's INLINE_BLOCKS
    cleared, for changes made to blocks and TENS fields as before 1.6."""
    if block_records:
        p = split(data, keep_index=keep_index)
        for i in [i for i, r in enumerate(p.recs) if r.type == L.TENS and r.encoding is not None][::-1]:
            block_to_record(p, i)
        flags = int.from_bytes(p.header[12:16], "little") & ~L.INLINE_BLOCKS
        p.header = p.header[:12] + u32(flags)
        return p
    data = bytes(data)
    pos = L.HEADER_SIZE
    inline_blocks = records.check_header(data[:L.HEADER_SIZE]).inline_blocks
    recs = []
    prefixed, history, prev = False, False, b""
    while True:
        head = records.parse_record_head(data[pos:pos + 16], pos)
        payload = data[pos + 16: pos + 16 + head.length]
        rec = Rec(head.type, payload, pos, size=16 + head.length)
        if head.type == L.INDX:
            assert pos + 16 + head.length + L.TRAILER_SIZE == len(data), "split needs a valid file"
            if keep_index:
                recs.append(rec)
            fh = records.check_header(data[:L.HEADER_SIZE])
            return Parts(data[:L.HEADER_SIZE], recs,
                         records.parse_index(payload, pos, fh.compact_index, fh.inline_blocks), payload,
                         data[pos + 16 + head.length:], prefixed)
        if head.type == L.META and pos == L.HEADER_SIZE:
            history = records.parse_meta(payload).history   # (1.9) TENS flag HISTORY brings previous_hash
        if head.type == L.META and pos == L.HEADER_SIZE and records.parse_meta(payload).prefixed_names:
            prefixed = True
            rec.payload = u32(int.from_bytes(payload[:4], "little") & ~L.PREFIXED_NAMES) + payload[4:]
        if head.type == L.TENS:
            th = records.parse_tensor(payload, "", prev if prefixed else None, inline_blocks, history)
            rec.name = th.name
            if th.inline_at is not None:
                rec.encoding = payload[th.inline_at]
            name = rec.name.encode()
            if prefixed:   # the whole name, as a file without PREFIXED_NAMES has it
                _, at = read_varint(payload, 0)
                n, at = read_varint(payload, at)
                rec.payload = varint(len(name)) + name + payload[at + n:]
            prev = name
        elif head.type == L.BLCK:
            rec.encoding = blck_encoding(payload)
        recs.append(rec)
        pos += 16 + head.length


def parse_file(data: bytes, *, block_records: bool = False) -> Parts:
    """:func:`split`, keeping the INDX record as the last of ``recs`` (``p.recs[-1].payload``, ``p.find``)."""
    return split(data, keep_index=True, block_records=block_records)


def set_first_encoding(p: Parts, encoding: int) -> None:
    """Overwrite the encoding byte of the first BLCK record (tensor and block ordinals are one byte each)."""
    r = next(r for r in p.recs if r.type == L.BLCK)
    pl = bytearray(r.payload)
    pl[2] = encoding
    r.payload = bytes(pl)
    r.encoding = encoding


def tens_fields_end(payload: bytes) -> tuple[int, int]:
    """(where a TENS payload's fields end — its inline block, if any, starts there —, where its flags
    byte is), for a payload with its name whole (as :func:`split` gives them). A flag bit 2 is read as
    HISTORY (1.9), its previous_hash among the fields, as in a file whose META has HISTORY."""
    th = records.parse_tensor(payload, "", None, True, True)
    end = th.inline_at if th.inline_at is not None else len(payload)
    return end, end - 8 - (8 if th.needs_base else 0) - (8 if th.needs_history else 0) - 1


def _split_inline(r: Rec, tensor: int) -> tuple[Rec, Rec]:
    """A TENS record carrying its block (§7) as the TENS record without it and that block's BLCK record."""
    end, at = tens_fields_end(r.payload)
    pl = bytearray(r.payload[:end])
    pl[at] &= ~L.INLINE_BLOCK
    return (replace(r, payload=bytes(pl), encoding=None, checksum=None),
            Rec(L.BLCK, varint(tensor) + varint(0) + r.payload[end:], encoding=r.encoding))


def block_to_record(p: Parts, i: int) -> None:
    """Move the inline block of TENS ``p.recs[i]`` into a BLCK record right after it (flag cleared)."""
    tensor = sum(1 for q in p.recs[:i] if q.type == L.TENS)
    p.recs[i:i + 1] = _split_inline(p.recs[i], tensor)


def tens_payload(name, dtype: int, dims, block_elems: int, flags: int, base_hash=None, target_hash: int = 0,
                 ndim: int | None = None, *, name_len: int | None = None) -> bytes:
    """A TENS payload (§7) from its fields, any of them out of range: ``name`` (str or bytes) with its
    length (``name_len`` to lie about it), dtype code, dims (``ndim`` to lie about their count),
    block_elems, flags, the base hash (written if flags bit 0) and the target hash."""
    raw = name.encode() if isinstance(name, str) else name
    out = varint(len(raw) if name_len is None else name_len) + raw
    out += bytes([dtype, len(dims) if ndim is None else ndim])
    out += b"".join(varint(d) for d in dims) + varint(block_elems) + bytes([flags])
    if flags & 1:
        out += u64(base_hash or 0)
    return out + u64(target_hash)


# ------------------------------------------------------------------------------------ reassembly


def assemble(p: Parts, recs: list | None = None, *, header: bytes | None = None, base_digest: bytes | None = None,
             target_digest: bytes | None = None, index_fn=None, index_payload: bytes | None = None,
             trailer_fn=None, list_others: bool = True, prefixed: bool | None = None) -> bytes:
    """Write a file from ``recs`` (default ``p.recs``): fresh record checksums, a consistent index (§10)
    and trailer (§11).

    ``header`` (default ``p.header``) is written first. INDX records among ``recs`` are dropped and a
    new index is built: an entry per TENS with its following BLCKs, and every other record — a META
    not right after the header included — among the other records (``list_others=False`` leaves them
    out); the digests are ``p.index``'s unless ``base_digest``/``target_digest`` are given.
    ``index_fn(index)`` may change that :class:`arcfmt.records.Index` before it is built;
    ``index_payload`` replaces the INDX payload verbatim. ``trailer_fn(t: bytearray)`` may change the
    40-byte trailer in place (:func:`fix_trailer_checksum` then, to keep its checksum right).
    ``prefixed``: write the names as a file with PREFIXED_NAMES has them (:func:`prefix_names`);
    default: as the file ``p`` came from had them. The index is compact (§10.1) when the header written
    has COMPACT_INDEX (``FULL_INDEX_HEADER``: a valid header without it, for the index's offset and
    checksum columns), and lists TENS records' inline blocks (``Rec.encoding``) when it has
    INLINE_BLOCKS — without it, each inline block is written as a BLCK record after its TENS; the
    trailer repeats the header's defined flags.
    """
    out = bytearray(header if header is not None else p.header)
    flags = int.from_bytes(out[12:16], "little") & L.HEADER_FLAGS
    compact, inline = bool(flags & L.COMPACT_INDEX), bool(flags & L.INLINE_BLOCKS)
    entries, others = [], []
    recs = p.recs if recs is None else recs
    if not inline:   # a header without INLINE_BLOCKS: every inline block in its own record
        recs = list(recs)
        for k in range(len(recs) - 1, -1, -1):
            r = recs[k]
            if r.type == L.TENS and r.raw is None and r.encoding is not None:
                recs[k:k + 1] = _split_inline(r, sum(1 for q in recs[:k] if q.type == L.TENS and q.raw is None))
    for r in prefix_names(p, recs) if (p.prefixed if prefixed is None else prefixed) else recs:
        if r.type == L.INDX:
            continue
        off = len(out)
        rec = r.bytes()
        out += rec
        ck = int.from_bytes(rec[8:16], "little")
        if r.raw is None and r.type == L.TENS:
            entries.append(records.IndexEntry(r.name, off, len(rec), ck, []))
            if r.encoding is not None:   # its inline block (§7): listed with size 0
                entries[-1].blocks.append(records.BlockRef(off, 0, None, r.encoding))
        elif r.raw is None and r.type == L.BLCK and entries:
            enc = r.encoding if r.encoding is not None else blck_encoding(r.payload)
            entries[-1].blocks.append(records.BlockRef(off, len(rec), ck, enc))
        elif (r.type != L.META or off != L.HEADER_SIZE) and list_others:
            others.append(records.OtherRecord(off, len(rec), r.type))
    index = records.Index(p.index.base_digest if base_digest is None else base_digest,
                          p.index.target_digest if target_digest is None else target_digest, entries, others,
                          compact, inline)
    if index_fn is not None:
        index_fn(index)
    index_offset = len(out)
    index_rec = raw_record(L.INDX, records.build_index(index) if index_payload is None else index_payload)
    out += index_rec
    trailer = bytearray(records.build_trailer(index_offset, len(index_rec), flags))
    if trailer_fn is not None:
        trailer_fn(trailer)
    out += trailer
    return bytes(out)


# ------------------------------------------------------------------------------------ the index body


def index_fields(payload: bytes, compact: bool) -> dict:
    """An INDX payload's decoded body (§10; ``compact``: laid out as COMPACT_INDEX says) as its fields,
    columns as lists: change them, then :func:`raw_index_payload`."""
    q = L.IndexPayload.parse(bytes(payload))
    body = L.index_body(compact).parse(bytes(records.codecs.decode(q.codec, q.body, q.body_length)))
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in body.items() if not k.startswith("_")}


def raw_index_payload(body: bytes) -> bytes:
    """An INDX payload holding ``body`` (built by hand, any fault in it) with the raw codec."""
    return bytes([0]) + varint(len(body)) + bytes(body)


# ------------------------------------------------------------------------------------ the trailer


def fix_trailer_checksum(trailer) -> bytes:
    """Recompute the trailer checksum (xxh3-64 of bytes 0-23, §11): a bytearray is fixed in place; the
    fixed trailer is returned either way."""
    ck = u64(xxhash.xxh3_64_intdigest(bytes(trailer[:24])))
    if isinstance(trailer, bytearray):
        trailer[24:32] = ck
        return bytes(trailer)
    return bytes(trailer[:24]) + ck + bytes(trailer[32:])


def patch_trailer(data: bytes, offset: int, new: bytes, fix_checksum: bool = True) -> bytes:
    """Overwrite bytes of a file's trailer (``offset`` relative to it), fixing its checksum unless told not to."""
    d = bytearray(data)
    t = bytearray(d[-L.TRAILER_SIZE:])
    t[offset: offset + len(new)] = new
    if fix_checksum:
        fix_trailer_checksum(t)
    d[-L.TRAILER_SIZE:] = t
    return bytes(d)


def xz_with_dictionary_code(data: bytes, code: int) -> bytes:
    """``data`` as one xz stream (LZMA2, no check) whose filter properties declare dictionary-size code
    ``code`` (SPEC.md §9: the declared size is what the xz limit is checked against), header CRC fixed."""
    import lzma
    import zlib

    x = bytearray(lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_NONE,
                                filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 1 << 20}]))
    hsize = (x[12] + 1) * 4
    hdr = x[12:12 + hsize]
    k = hdr.index(b"\x21\x01", 2) + 2
    hdr[k] = code
    hdr[-4:] = zlib.crc32(bytes(hdr[:-4])).to_bytes(4, "little")
    x[12:12 + hsize] = hdr
    return bytes(x)
