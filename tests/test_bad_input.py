"""Bad input: every failure is a specific subclass of ``arcfmt.ArcError`` (SPEC.md §15), never another
exception, never a hang, never wrong data.

Covers truncation (every structural boundary, every byte offset), single-bit flips, bad magic, versions,
reserved bits, unknown records, limits (§14), decompression bombs (§9), unsupported ids, structural
corruption, failed verification and wrong bases (§12.3), for both the random-access reader
(``arcfmt.decode``) and the streaming reader (``StreamReader``).

Crafted files are rebuilt with fresh record checksums, index and trailer (``support.records.assemble``) so
that the check under test is the one that fires.
"""
from __future__ import annotations

import bz2
import functools
import io
import lzma
import resource
import signal
import struct

import ml_dtypes
import numpy as np
import pytest
import xxhash
import zstandard

import arcfmt
from arcfmt import layout as L
from arcfmt import records
from arcfmt.errors import (
    ArcError,
    BadMagicError,
    ChecksumError,
    CorruptError,
    LimitError,
    ReservedBitsError,
    TruncatedError,
    UnknownRecordError,
    UnsupportedError,
    UnsupportedVersionError,
    VerificationError,
    WrongBaseError,
)
from support.data import StreamReader, assert_bit_exact, stream_decode
from support.records import (
    BLOCK_RECORDS_HEADER,
    FULL_INDEX_HEADER,
    Rec,
    assemble,
    fix_trailer_checksum,
    parse_file,
    patch_trailer,
    tens_payload,
    u64,
    varint,
)

# The categories of SPEC.md §15: a failure must be one of these exact classes (not ArcError itself).
SPEC_CLASSES = {
    BadMagicError, UnsupportedVersionError, TruncatedError, ChecksumError, ReservedBitsError, LimitError,
    UnknownRecordError, UnsupportedError, CorruptError, WrongBaseError, VerificationError,
}


@pytest.fixture(autouse=True)
def _no_hang():
    """Fail (instead of hanging) when a single test runs for more than 60 s."""
    def on_alarm(signum, frame):
        raise TimeoutError("test took more than 60 s: the decoder hangs?")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------- readers

def ra(data, base):
    """Random access (trailer -> index -> records)."""
    return arcfmt.decode(base, data, workers=1)


def sr(data, base):
    """Streaming, front to back, without the index."""
    return stream_decode(data, base)


def ra_file(data, base):
    """Random access through a file object (``FileSource``) instead of a buffer."""
    return arcfmt.decode(base, io.BytesIO(data), workers=1)


READERS = [pytest.param(ra, id="random"), pytest.param(sr, id="stream")]
READERS3 = READERS + [pytest.param(ra_file, id="random-file")]


def outcome(reader, data, base):
    """The exception a reader raises on ``data`` (checked to be a §15 class with a message), or its result."""
    try:
        return reader(data, base)
    except ArcError as exc:
        assert type(exc) in SPEC_CLASSES, f"{type(exc).__name__} is not a specific §15 class: {exc}"
        assert str(exc).strip(), f"{type(exc).__name__} has an empty message"
        return exc
    except Exception as exc:  # noqa: BLE001 - any other exception is a bug
        pytest.fail(f"{reader.__name__}: non-ArcError exception {type(exc).__name__}: {exc!r}")


def expect(expected, reader, data, base=None):
    """``reader(data, base)`` must raise one of ``expected`` (a class or a set of classes)."""
    expected = expected if isinstance(expected, (set, frozenset, tuple)) else {expected}
    got = outcome(reader, data, base)
    assert isinstance(got, ArcError), f"{reader.__name__}: expected {_names(expected)}, decoded without error"
    assert type(got) in expected, f"{reader.__name__}: expected {_names(expected)}, got {type(got).__name__}: {got}"
    return got


def _names(classes):
    return "/".join(sorted(c.__name__ for c in classes))


def mismatch(expected, reader, data, base=None):
    """Like ``expect`` but returns a description of the mismatch (None if as expected), so that loops
    over many inputs can report every bad case at once."""
    expected = expected if isinstance(expected, (set, frozenset, tuple)) else {expected}
    try:
        got = outcome(reader, data, base)
    except pytest.fail.Exception as exc:
        return str(exc)
    if not isinstance(got, ArcError):
        return f"decoded without error, expected {_names(expected)}"
    if type(got) not in expected:
        return f"expected {_names(expected)}, got {type(got).__name__}: {got}"
    return None


def assert_all_as_expected(bad: dict, what: str) -> None:
    if bad:
        lines = [f"  {k}: {v}" for k, v in list(bad.items())[:20]]
        pytest.fail(f"{len(bad)} {what} not as expected (SPEC.md §15):\n" + "\n".join(lines))


def both(expected, data, base=None):
    for reader in (ra, sr):
        expect(expected, reader, data, base)


# ------------------------------------------------------------------------------------- crafting

def blck_payload(tensor, block, encoding, params, streams):
    """A BLCK payload (SPEC.md §8): ``streams`` is a list of (codec id, stored bytes)."""
    head = varint(tensor) + varint(block) + bytes([encoding]) + b"".join(varint(x) for x in params)
    head += b"".join(bytes([c]) + varint(len(st)) for c, st in streams)
    return head + b"".join(bytes(st) for _, st in streams)


def replace(parsed, pred, new_payload=None, **fields):
    """Copy of the records with the first record matching ``pred`` replaced."""
    out = []
    done = False
    for r in parsed.recs:
        if not done and pred(r):
            r = Rec(r.type, r.payload if new_payload is None else new_payload, r.offset, name=r.name)
            for k, v in fields.items():
                setattr(r, k, v)
            done = True
        out.append(r)
    assert done
    return out


def insert_after(parsed, index, rec):
    recs = list(parsed.recs)
    recs.insert(index + 1, rec)
    return recs


def rec_index(parsed, rtype, nth=0):
    return [i for i, r in enumerate(parsed.recs) if r.type == rtype][nth]


def tens_of(parsed, name):
    return next(r for r in parsed.recs if r.type == L.TENS and r.name == name)


def blocks_of(parsed, name):
    """The BLCK records of tensor ``name``, in order."""
    out, cur = [], None
    for r in parsed.recs:
        if r.type == L.TENS:
            cur = r.name
        elif r.type == L.BLCK and cur == name:
            out.append(r)
    return out


def zstd_frame(content: bytes, *, fcs: int, window_log: int = 10) -> bytes:
    """A hand-made Zstandard frame: 4-byte content size field, explicit window, one raw block."""
    fhd = 0x80  # FCS_Field_Size = 4 bytes, Single_Segment = 0, no checksum, no dictionary
    wd = (window_log - 10) << 3
    block = (1 | (0 << 1) | (len(content) << 3)).to_bytes(3, "little") + content
    return struct.pack("<I", 0xFD2FB528) + bytes([fhd, wd]) + struct.pack("<I", fcs) + block


def zstd_rle_bomb(fcs: int, total: int) -> bytes:
    """A small Zstandard frame declaring ``fcs`` bytes whose RLE blocks expand to ``total`` bytes."""
    blk = 1 << 17
    n = total // blk
    blocks = b"".join(((1 if i == n - 1 else 0) | (1 << 1) | (blk << 3)).to_bytes(3, "little") + b"\0"
                      for i in range(n))
    return struct.pack("<I", 0xFD2FB528) + bytes([0x80, 17 << 3]) + struct.pack("<I", fcs) + blocks


# ------------------------------------------------------------------------------------- sanity

def test_fixture_files_are_valid(small_file, medium_file):
    for base, target, d in (small_file, medium_file):
        assert_bit_exact(ra(d, base), target)
        assert_bit_exact(sr(d, base), target)
        p = parse_file(d)
        assert assemble(p) == d  # the crafting helper reproduces the writer byte for byte
    p = parse_file(small_file[2])
    assert [r.type for r in p.recs][:2] == [L.META, L.NOTE]
    assert len(small_file[2]) < 600


# ------------------------------------------------------------------------------------- truncation

@pytest.mark.parametrize("reader", READERS3)
def test_truncation_at_every_byte_offset(small_file, reader):
    """A valid file cut at any byte is `truncated` (§11, §12.1, §12.2): its magic is a valid prefix."""
    base, _, d = small_file
    cuts = [k for k in range(len(d)) if k not in INSIDE_HEADER_AFTER_MAGIC]
    bad = {f"cut at {k}": m for k in cuts if (m := mismatch(TruncatedError, reader, d[:k], base))}
    assert_all_as_expected(bad, "truncations")


def structural_boundaries(d):
    p = parse_file(d)
    cuts = {0, 1, 7, 8, L.HEADER_SIZE}
    for r in p.recs:
        o, n = r.offset, r.size - 16   # as in the file (split gives whole TENS names)
        cuts |= {o, o + 4, o + 8, o + 15, o + 16, o + 17, o + 16 + n - 1, o + 16 + n}
    t = len(d) - L.TRAILER_SIZE
    cuts |= {t, t + 1, t + 8, t + 16, t + 18, t + 20, t + 24, t + 32, t + 39}
    return sorted(c for c in cuts if 0 <= c < len(d) and c not in INSIDE_HEADER_AFTER_MAGIC)


# Cuts of 9..15 bytes (whole magic, then part of version/flags) have their own test below, so that one
# finding there does not hide the others.
INSIDE_HEADER_AFTER_MAGIC = range(9, 16)


@pytest.mark.parametrize("reader", READERS3)
def test_truncation_at_structural_boundaries(medium_file, reader):
    base, _, d = medium_file
    cuts = structural_boundaries(d)
    assert len(cuts) > 40
    bad = {f"cut at {k}": m for k in cuts if (m := mismatch(TruncatedError, reader, d[:k], base))}
    assert_all_as_expected(bad, "truncations")


@pytest.mark.parametrize("reader", READERS3)
def test_truncation_of_keyframe_file(reader):
    target = {"a": np.arange(300, dtype=np.float32), "b": np.zeros((0, 2), np.int8)}
    d = arcfmt.encode(None, target, block_elems=100)
    bad = {f"cut at {k}": m for k in structural_boundaries(d) if (m := mismatch(TruncatedError, reader, d[:k], None))}
    assert_all_as_expected(bad, "truncations")


@pytest.mark.parametrize("reader", READERS3)
def test_truncation_inside_the_header_after_the_magic(small_file, reader):
    """9..15 bytes: the full magic, then the file ends inside the version/flags fields. The header magic is
    valid, so this is a cut-off arcfmt file (`truncated`, §11/§12.2), not `bad_magic`."""
    base, _, d = small_file
    bad = {f"cut at {k}": m for k in INSIDE_HEADER_AFTER_MAGIC
           if (m := mismatch(TruncatedError, reader, d[:k], base))}
    assert_all_as_expected(bad, "truncations")


@pytest.mark.parametrize("reader", READERS)
def test_empty_and_tiny_inputs(reader):
    expect(TruncatedError, reader, b"", None)
    expect(TruncatedError, reader, L.MAGIC, None)
    # §12.1: shorter than 16 bytes and not a prefix of the magic is `bad_magic` for random access; a
    # streaming reader may also report that the input ended inside the header (§12.2).
    for junk in (b"hello", b"\x8aARX"):
        expect(BadMagicError if reader is ra else {BadMagicError, TruncatedError}, reader, junk, None)


# ------------------------------------------------------------------------------------- bit flips

def flip_expectations(d):
    """Per byte offset: (classes for random access, classes for streaming); None = must decode exactly."""
    p = parse_file(d)
    ra_exp, sr_exp = {}, {}
    for i in range(8):
        ra_exp[i] = sr_exp[i] = {BadMagicError}
    for i in (8, 9):
        ra_exp[i] = sr_exp[i] = {UnsupportedVersionError}
    for i in (10, 11):  # minor: header and trailer versions must agree
        ra_exp[i] = sr_exp[i] = {CorruptError}
    for i in range(12, 16):
        ra_exp[i] = sr_exp[i] = {ReservedBitsError}
    if p.index.compact:  # bit 0 cleared: the compact body read as a full one (§10) does not fit it
        ra_exp[12] = sr_exp[12] = {ReservedBitsError, CorruptError, LimitError}
    for r in p.recs:
        o, n = r.offset, r.size - 16   # as in the file (split gives whole TENS names)
        # a random-access reader reads only the 16-byte header of an ancillary record, and checks its
        # type and length against the index (SPEC.md §12.1 step 4); its checksum field and payload
        # are never read, so damage there cannot matter
        used = r.type != L.NOTE
        for i in range(o, o + 4):  # type
            ra_exp[i] = {CorruptError, ChecksumError}
            sr_exp[i] = {CorruptError, ChecksumError, UnknownRecordError}
        for i in range(o + 4, o + 8):  # length
            ra_exp[i] = {CorruptError, LimitError}
            sr_exp[i] = {ChecksumError, TruncatedError, LimitError, CorruptError}
        for i in range(o + 8, o + 16):  # checksum field (TENS/BLCK: also compared with a full index)
            compared = r.type not in (L.META, L.INDX) and not p.index.compact
            ra_exp[i] = ({CorruptError} if compared else {ChecksumError}) if used else None
            sr_exp[i] = {ChecksumError}
        for i in range(o + 16, o + 16 + n):  # payload: caught by the record checksum (§15)
            ra_exp[i] = {ChecksumError} if used else None
            sr_exp[i] = {ChecksumError}
    t = len(d) - L.TRAILER_SIZE
    for i in range(t, t + 32):
        ra_exp[i] = sr_exp[i] = {ChecksumError}
    for i in range(t + 32, t + 40):  # trailer magic gone, header magic fine: a cut-off file
        ra_exp[i] = sr_exp[i] = {TruncatedError}
    assert sorted(ra_exp) == list(range(len(d)))
    return ra_exp, sr_exp


@pytest.mark.parametrize("reader", READERS)
def test_single_bit_flips_at_every_byte(small_file, reader):
    base, target, d = small_file
    exp = flip_expectations(d)[0 if reader is ra else 1]
    problems = {}
    for i in range(len(d)):
        for bit in range(8):
            bad = bytearray(d)
            bad[i] ^= 1 << bit
            got = outcome(reader, bytes(bad), base)
            where = f"flip byte {i} bit {bit}"
            if not isinstance(got, ArcError):
                assert_bit_exact(got, target)  # never wrong data
                if exp[i] is not None:
                    problems[where] = f"decoded without error, expected {_names(exp[i])}"
            elif exp[i] is None:
                problems[where] = f"{type(got).__name__}: {got} (an unread ancillary record cannot matter)"
            elif type(got) not in exp[i]:
                problems[where] = f"expected {_names(exp[i])}, got {type(got).__name__}: {got}"
    assert_all_as_expected(problems, "bit flips")


@pytest.mark.parametrize("reader", READERS)
def test_byte_corruption_never_returns_wrong_data(medium_file, reader):
    """Random byte overwrites in a larger file (compressed streams, several tensors)."""
    base, target, d = medium_file
    rng = np.random.default_rng(2024)
    for i in rng.choice(len(d), size=150, replace=False).tolist():
        bad = bytearray(d)
        bad[i] = (bad[i] + int(rng.integers(1, 256))) % 256
        got = outcome(reader, bytes(bad), base)
        if not isinstance(got, ArcError):
            assert_bit_exact(got, target)


# ------------------------------------------------------------------------------------- magic, versions

@pytest.mark.parametrize("reader", READERS)
def test_bad_magic(small_file, reader):
    base, _, d = small_file
    expect(BadMagicError, reader, b"\x89PNG\r\n\x1a\n" + d[8:], base)
    expect(BadMagicError, reader, b"\x00" * 8 + d[8:], base)
    expect(BadMagicError, reader, b"PK\x03\x04" + bytes(300), base)
    expect(BadMagicError, reader, b"just some text, not an arcfmt file\n" * 10, base)
    expect(BadMagicError, reader, bytes(range(256)) * 2, base)


@pytest.mark.parametrize("major", [0, 2, 0xFFFF])
@pytest.mark.parametrize("reader", READERS)
def test_future_major_version(small_file, reader, major):
    base, _, d = small_file
    both_patched = bytearray(d)
    both_patched[8:10] = major.to_bytes(2, "little")
    both_patched = patch_trailer(bytes(both_patched), 16, major.to_bytes(2, "little"))
    expect(UnsupportedVersionError, reader, both_patched, base)
    header_only = bytearray(d)
    header_only[8:10] = major.to_bytes(2, "little")
    expect(UnsupportedVersionError, reader, bytes(header_only), base)
    trailer_only = patch_trailer(d, 16, major.to_bytes(2, "little"))
    expect(UnsupportedVersionError, reader, trailer_only, base)


@pytest.mark.parametrize("reader", READERS)
def test_future_minor_version_is_accepted(small_file, reader):
    """§16: a 1.m decoder reads any 1.n file; the minor version is read but any value accepted."""
    base, target, d = small_file
    for minor in (1, 7, 0xFFFF):
        f = bytearray(d)
        f[10:12] = minor.to_bytes(2, "little")
        f = patch_trailer(bytes(f), 18, minor.to_bytes(2, "little"))
        assert_bit_exact(reader(f, base), target)


@pytest.mark.parametrize("reader", READERS)
def test_header_and_trailer_minor_must_agree(small_file, reader):
    base, _, d = small_file
    f = bytearray(d)
    f[10:12] = (L.MINOR + 1).to_bytes(2, "little")
    expect(CorruptError, reader, bytes(f), base)
    expect(CorruptError, reader, patch_trailer(d, 18, (L.MINOR + 1).to_bytes(2, "little")), base)


def test_trailer_checksum_is_xxh3_of_first_24_bytes(small_file):
    d = small_file[2]
    t = d[-L.TRAILER_SIZE:]
    assert int.from_bytes(t[24:32], "little") == xxhash.xxh3_64_intdigest(t[:24])
    assert fix_trailer_checksum(t) == t


# ------------------------------------------------------------------------------------- reserved bits

def full_index(d: bytes):
    """``d`` taken apart with a full index (offset and checksum columns, no COMPACT_INDEX, SPEC.md §10)."""
    return parse_file(assemble(parse_file(d), header=FULL_INDEX_HEADER))


@pytest.mark.parametrize("bit", [2, 7, 8, 31])   # bit 0 is COMPACT_INDEX (1.5), bit 1 INLINE_BLOCKS (1.6)
@pytest.mark.parametrize("reader", READERS)
def test_reserved_bits_header_flags(small_file, reader, bit):
    base, _, d = small_file
    f = bytearray(d)
    f[12:16] = (1 << bit | 3).to_bytes(4, "little")
    expect(ReservedBitsError, reader, bytes(f), base)


@pytest.mark.parametrize("reader", READERS)
def test_compact_index_flag_says_how_the_index_is_laid_out(small_file, reader):
    """COMPACT_INDEX (header bit 0, §4, §10.1): both layouts decode the same; the flag on the other layout
    leaves an index body that does not fit, refused before any tensor is decoded."""
    base, target, d = small_file
    assert parse_file(d).index.compact
    full = assemble(full_index(d))
    assert len(full) > len(d)
    assert_bit_exact(reader(full, base), target)
    for f, flags in ((d, 0), (full, 1)):
        bad = bytearray(f)
        bad[12:16] = flags.to_bytes(4, "little")
        expect({CorruptError, LimitError}, reader, bytes(bad), base)


@pytest.mark.parametrize("bit", [2, 7, 8, 31])   # bits 0 and 1 as in the header
@pytest.mark.parametrize("reader", READERS)
def test_reserved_bits_trailer_flags(small_file, reader, bit):
    base, _, d = small_file
    expect(ReservedBitsError, reader, patch_trailer(d, 20, (1 << bit | 3).to_bytes(4, "little")), base)


@pytest.mark.parametrize("reader", READERS)
def test_trailer_compact_index_bit_must_be_the_headers(small_file, reader):
    """§11: the trailer repeats the header's COMPACT_INDEX bit (a reader of the tail alone has only it)."""
    base, _, d = small_file
    expect(CorruptError, reader, patch_trailer(d, 20, bytes(4)), base)
    full = assemble(full_index(d))
    expect(CorruptError, reader, patch_trailer(full, 20, (1).to_bytes(4, "little")), base)


@pytest.mark.parametrize("bit", [2, 5, 31])   # bit 0 is PREFIXED_NAMES (1.3), bit 1 HISTORY (1.9)
@pytest.mark.parametrize("reader", READERS)
def test_reserved_bits_meta_flags(small_file, reader, bit):
    base, _, d = small_file
    p = parse_file(d)
    meta = p.recs[0]
    payload = (1 << bit).to_bytes(4, "little") + meta.payload[4:]
    expect(ReservedBitsError, reader, assemble(p, replace(p, lambda r: r.type == L.META, payload)), base)


@pytest.mark.parametrize("bit", range(1, 8))
@pytest.mark.parametrize("tensor", ["w", "k"])  # with and without NEEDS_BASE
@pytest.mark.parametrize("reader", READERS)
def test_reserved_bits_tens_flags(small_file, reader, tensor, bit):
    base, _, d = small_file
    p = parse_file(d)
    rec = tens_of(p, tensor)
    th = records.parse_tensor(rec.payload, "test")
    flags_at = len(rec.payload) - 8 - (8 if th.needs_base else 0) - 1
    assert rec.payload[flags_at] == (1 if th.needs_base else 0)
    payload = bytearray(rec.payload)
    payload[flags_at] |= 1 << bit
    f = assemble(p, replace(p, lambda r: r is rec, bytes(payload)))
    expect(ReservedBitsError, reader, f, base)


# ------------------------------------------------------------------------------------- records

@pytest.mark.parametrize("where", ["after_meta", "after_tens", "before_indx"])
@pytest.mark.parametrize("rtype", [b"XTRA", b"Zzzz", b"Meta"])
@pytest.mark.parametrize("reader", READERS)
def test_unknown_critical_record(small_file, reader, where, rtype):
    """§5: an unknown critical type is `unknown_record`; a random-access reader learns of it from the
    index's other records (§10) without reading it."""
    base, _, d = small_file
    p = parse_file(d)
    at = {"after_meta": 0, "after_tens": rec_index(p, L.TENS), "before_indx": len(p.recs) - 2}[where]
    f = assemble(p, insert_after(p, at, Rec(rtype, b"future feature")))
    expect(UnknownRecordError, reader, f, base)
    f = assemble(p, insert_after(p, at, Rec(rtype, b"")))
    expect(UnknownRecordError, reader, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_every_record_must_be_in_the_index(small_file, reader):
    """§10 tiling / §12.2: a record the index does not list (here the written note) is `corrupt`."""
    base, target, d = small_file
    p = parse_file(d)
    assert_bit_exact(reader(assemble(p), base), target)
    expect(CorruptError, reader, assemble(p, list_others=False), base)
    f = assemble(p, insert_after(p, 0, Rec(b"zzzz", b"extra")), list_others=False)
    expect(CorruptError, reader, f, base)


def test_compact_offsets_are_the_full_index_offsets(medium_file):
    """§10.1: the offsets a compact index derives are those a full index lists, wherever ancillary records
    stand (none, first, between a TENS and its blocks, in runs, last); one listed a byte off is refused."""
    base, target, d = medium_file
    rng = np.random.default_rng(7)
    p = parse_file(d)
    for trial in range(40):
        recs = [r for r in p.recs if r.type not in (L.NOTE, L.INDX)]
        for _ in range(int(rng.integers(0, 6))):
            recs.insert(int(rng.integers(1, len(recs) + 1)), Rec(b"note", bytes(int(rng.integers(0, 40)))))
        # every block a record in both (a full index has no inline blocks)
        compact, full = assemble(p, recs, header=BLOCK_RECORDS_HEADER), assemble(p, recs, header=FULL_INDEX_HEADER)
        pc, pf = parse_file(compact), parse_file(full)
        assert pc.index.compact and not pf.index.compact
        assert [(e.tens_offset, e.tens_size, [(b.offset, b.size) for b in e.blocks]) for e in pc.index.entries] == \
            [(e.tens_offset, e.tens_size, [(b.offset, b.size) for b in e.blocks]) for e in pf.index.entries]
        assert pc.index.others == pf.index.others
        if trial % 8 == 0:
            assert_bit_exact(ra(compact, base), target)
            assert_bit_exact(sr(compact, base), target)
        if pc.index.others:
            j = int(rng.integers(0, len(pc.index.others)))

            def off_by_one(ix, j=j):
                ix.others[j].offset += int(rng.choice([-1, 1]))
            with pytest.raises(CorruptError, match="10.1"):
                parse_file(assemble(pc, index_fn=off_by_one))


@pytest.mark.parametrize("reader", READERS)
def test_index_other_records_checked(small_file, reader):
    base, _, d = small_file
    p = full_index(d)
    idx = p.index
    note = idx.others[0]
    for bad_type, exc in ((b"no e", CorruptError), (b"TENS", CorruptError), (b"BLCK", CorruptError),
                          (b"META", CorruptError), (b"INDX", CorruptError), (b"Note", UnknownRecordError)):
        others = [records.OtherRecord(note.offset, note.size, bad_type)]
        payload = records.build_index(records.Index(idx.base_digest, idx.target_digest, idx.entries, others))
        f = assemble(p, index_payload=payload)
        if reader is ra or exc is CorruptError:
            expect(exc, reader, f, base)
        else:
            expect({exc, CorruptError}, reader, f, base)
    # A type that disagrees with the record (ancillary either way), an offset or size that is off.
    for other in (records.OtherRecord(note.offset, note.size, b"zzzz"),
                  records.OtherRecord(note.offset + 1, note.size, b"note"),
                  records.OtherRecord(note.offset, note.size + 1, b"note")):
        payload = records.build_index(records.Index(idx.base_digest, idx.target_digest, idx.entries, [other]))
        f = assemble(p, index_payload=payload)
        if reader is sr or other.type == b"note":
            expect(CorruptError, reader, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_other_count_beyond_limit(small_file, reader):
    base, _, d = small_file
    p = parse_file(d)
    body = bytearray(index_body(p.recs[-1].payload))
    n_others = len(p.index.others)
    tail = 4 + n_others * (8 + 4 + 4)
    assert int.from_bytes(body[-tail: -tail + 4], "little") == n_others
    body[-tail: -tail + 4] = (L.MAX_OTHER_RECORDS + 1).to_bytes(4, "little")
    f = assemble(p, index_payload=_index_payload(0, len(body), bytes(body)))
    expect(LimitError, reader, f, base)


@pytest.mark.parametrize("where", ["after_meta", "after_note", "after_tens", "between_blocks", "before_indx"])
@pytest.mark.parametrize("reader", READERS)
def test_unknown_ancillary_record_is_skipped(small_file, reader, where):
    base, target, d = small_file
    p = parse_file(d)
    at = {"after_meta": 0, "after_note": 1, "after_tens": rec_index(p, L.TENS),
          "between_blocks": rec_index(p, L.BLCK), "before_indx": len(p.recs) - 2}[where]
    for rtype, payload in ((b"zzzz", b"ignore me"), (b"xTRA", b""), (b"note", b"\xff\xfe invalid utf-8 is fine")):
        f = assemble(p, insert_after(p, at, Rec(rtype, payload)))
        assert_bit_exact(reader(f, base), target)


def test_written_note_record_is_skipped(small_file):
    base, target, d = small_file
    p = parse_file(d)
    notes = p.find(L.NOTE)
    assert [n.payload for n in notes] == [b"t"]
    assert_bit_exact(ra(d, base), target)
    assert_bit_exact(sr(d, base), target)
    buf = io.BytesIO()
    with arcfmt.DeltaWriter(buf, note="encoder: tests \u2713 " + "x" * 300) as w:
        w.write_tensors((n, base.get(n), target[n]) for n in target)
    assert_bit_exact(ra(buf.getvalue(), base), target)
    assert_bit_exact(sr(buf.getvalue(), base), target)


def test_ancillary_record_checksum_is_checked_when_streaming(small_file):
    base, _, d = small_file
    p = parse_file(d)
    good = records.build_record(b"zzzz", b"payload")
    bad = good[:8] + bytes(x ^ 0xFF for x in good[8:16]) + good[16:]
    f = assemble(p, insert_after(p, 0, Rec(b"zzzz", b"", raw=bad)))
    assert len(bad) == len(good)
    expect(ChecksumError, sr, f, base)
    # The written note, with its payload changed but not its checksum.
    note_at = p.find(L.NOTE)[0].offset + 16
    f = bytearray(d)
    f[note_at] ^= 0x01
    expect(ChecksumError, sr, bytes(f), base)


@pytest.mark.parametrize("rtype", [b"AB1D", b"\x00\x00\x00\x00", b"TEN ", b"t\xe9st"])
@pytest.mark.parametrize("reader", READERS)
def test_record_type_not_ascii_letters_is_corrupt(small_file, reader, rtype):
    """§5: a type with a byte that is not an ASCII letter is `corrupt` (random access: via the index)."""
    base, _, d = small_file
    p = parse_file(d)
    f = assemble(p, insert_after(p, 0, Rec(rtype, b"x")))
    expect(CorruptError, reader, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_record_out_of_order_is_corrupt(small_file, reader):
    base, _, d = small_file
    p = parse_file(d)
    recs = list(p.recs)
    # Swap the two blocks of tensor "w": their ordinals no longer match their places.
    i = rec_index(p, L.BLCK)
    recs[i], recs[i + 1] = recs[i + 1], recs[i]
    expect(CorruptError, reader, assemble(p, recs), base)


@pytest.mark.parametrize("reader", READERS)
def test_second_meta_or_missing_meta_is_corrupt(small_file, reader):
    base, _, d = small_file
    p = parse_file(d)
    expect(CorruptError, reader, assemble(p, insert_after(p, 1, p.recs[0])), base)
    expect(CorruptError, reader, assemble(p, p.recs[1:]), base)


# ------------------------------------------------------------------------------------- limits

@pytest.mark.parametrize("rtype", [b"zzzz", b"TENS", b"BLCK"])
def test_record_length_beyond_limit_streaming(small_file, rtype):
    """§5: a length beyond MAX_RECORD_PAYLOAD is `limit`, checked before the payload is read."""
    base, _, d = small_file
    p = parse_file(d)
    head8 = rtype + (L.MAX_RECORD_PAYLOAD + 1).to_bytes(4, "little")
    raw = head8 + u64(xxhash.xxh3_64_intdigest(head8))
    f = assemble(p, insert_after(p, 0, Rec(rtype, b"", raw=raw)))
    expect(LimitError, sr, f, base)
    for length in (0xFFFFFFFF, 1 << 31):
        head8 = rtype + length.to_bytes(4, "little")
        f = assemble(p, insert_after(p, 0, Rec(rtype, b"", raw=head8 + u64(xxhash.xxh3_64_intdigest(head8)))))
        expect(LimitError, sr, f, base)


def test_record_length_beyond_limit_random_access(small_file):
    """The record read through the index says its length is beyond MAX_RECORD_PAYLOAD: `limit` (§5), or the
    length disagrees with the index's size (`corrupt`, §10); either way nothing is read past the record."""
    base, _, d = small_file
    p = parse_file(d)
    for rtype in (L.TENS, L.BLCK, L.INDX, L.META):
        r = p.find(rtype)[0]
        f = bytearray(d)
        f[r.offset + 4: r.offset + 8] = (L.MAX_RECORD_PAYLOAD + 1).to_bytes(4, "little")
        expect({LimitError, CorruptError}, ra, bytes(f), base)


def _tens_file(small_file, payload, name="k"):
    base, _, d = small_file
    p = parse_file(d)
    return assemble(p, replace(p, lambda r: r.type == L.TENS and r.name == name, payload)), base


@pytest.mark.parametrize("reader", READERS)
def test_name_length_beyond_limit(small_file, reader):
    long_name = "n" * (L.MAX_NAME_BYTES + 1)
    p = parse_file(small_file[2])
    f = assemble(p, replace(p, lambda r: r.type == L.TENS and r.name == "k",
                              tens_payload(long_name, 3, [4], 4, 0), name=long_name))
    expect(LimitError, reader, f, small_file[0])


@pytest.mark.parametrize("declared", [L.MAX_NAME_BYTES + 1, (1 << 64) - 1])
@pytest.mark.parametrize("reader", READERS)
def test_declared_name_length_beyond_limit(small_file, reader, declared):
    """§14: a declared value beyond a limit is `limit`, rejected before anything is allocated for it,
    even when the payload does not hold that many bytes."""
    f, base = _tens_file(small_file, varint(declared) + b"k" + bytes([3, 1, 4, 4, 0]) + u64(0))
    expect(LimitError, reader, f, base)


def test_name_of_max_length_is_accepted():
    name = "x" * L.MAX_NAME_BYTES
    target = {name: np.arange(3, dtype=np.int16)}
    d = arcfmt.encode(None, target)
    assert_bit_exact(ra(d, None), target)
    assert_bit_exact(sr(d, None), target)


@pytest.mark.parametrize("reader", READERS)
def test_ndim_beyond_limit(small_file, reader):
    f, base = _tens_file(small_file, tens_payload("k", 3, [1] * (L.MAX_DIMS + 1), 1, 0))
    expect(LimitError, reader, f, base)
    f, base = _tens_file(small_file, tens_payload("k", 3, [1] * 40, 1, 0))
    expect(LimitError, reader, f, base)


@pytest.mark.parametrize("ndim", [L.MAX_DIMS + 1, 255])
@pytest.mark.parametrize("reader", READERS)
def test_declared_ndim_beyond_limit(small_file, reader, ndim):
    """ndim beyond MAX_DIMS is `limit` even when the dims it declares are not there (§14)."""
    f, base = _tens_file(small_file, tens_payload("k", 3, [4], 4, 0, ndim=ndim))
    expect(LimitError, reader, f, base)


def test_max_dims_is_accepted():
    target = {"x": np.arange(6, dtype=np.uint8).reshape((1,) * 14 + (2, 3))}
    d = arcfmt.encode(None, target)
    assert_bit_exact(ra(d, None), target)
    assert_bit_exact(sr(d, None), target)


@pytest.mark.parametrize("block_elems", [L.MAX_BLOCK_ELEMS + 1, 1 << 40, (1 << 64) - 1])
@pytest.mark.parametrize("reader", READERS)
def test_block_elems_beyond_limit(small_file, reader, block_elems):
    f, base = _tens_file(small_file, tens_payload("k", 3, [4], block_elems, 0))
    expect(LimitError, reader, f, base)


# A zero dimension makes n = 0 whatever comes before it (SPEC.md §7), so [2^63, 0] is not beyond the limit.
@pytest.mark.parametrize("dims", [[1 << 21, 1 << 21], [(1 << 40) + 1], [(1 << 64) - 1], [1 << 20, 1 << 20, 2]])
@pytest.mark.parametrize("reader", READERS)
def test_tensor_elems_beyond_limit(small_file, reader, dims):
    f, base = _tens_file(small_file, tens_payload("k", 3, dims, L.MAX_BLOCK_ELEMS, 0))
    expect(LimitError, reader, f, base)


def _huge_tensor_file(elems: int, dtype_code: int = 9) -> bytes:
    """A keyframe tensor of ``elems`` elements in blocks of MAX_BLOCK_ELEMS, declared but not stored: the
    index locates one 16-byte BLCK stub per block (they are never reached)."""
    tp = tens_payload("big", dtype_code, [elems], L.MAX_BLOCK_ELEMS, 0, target_hash=0)
    out = bytearray(records.build_header(0))   # the index built below lists offsets
    out += records.build_record(L.META, records.build_meta(records.Meta(None, None)))
    toff = len(out)
    trec = records.build_record(L.TENS, tp)
    out += trec
    blocks = []
    for _ in range(-(-elems // L.MAX_BLOCK_ELEMS)):
        blocks.append(records.BlockRef(len(out), 16, 0, 4))
        out += b"BLCK" + bytes(12)
    entry = records.IndexEntry("big", toff, len(trec), int.from_bytes(trec[8:16], "little"), blocks)
    ioff = len(out)
    irec = records.build_record(L.INDX, records.build_index(records.Index(bytes(16), bytes(16), [entry], [])))
    out += irec + records.build_trailer(ioff, len(irec), 0)
    return bytes(out)


@pytest.mark.parametrize("elems", [1 << 37, 1 << 40])
@pytest.mark.parametrize("reader", READERS)
def test_huge_declared_tensor_fails_with_an_arc_error(reader, elems):
    """A tensor within MAX_TENSOR_ELEMS but far beyond available memory (1-8 TiB of I64) in a small file:
    the decoder must fail with a typed error (§15: `limit` covers a resource need), never MemoryError, and
    must not allocate the tensor before any of its data has been checked (§17: bounded memory)."""
    f = _huge_tensor_file(elems)
    assert len(f) < 3_000_000
    got = outcome(reader, f, None)
    assert isinstance(got, ArcError)


@pytest.mark.parametrize("reader", READERS)
def test_blocks_per_tensor_beyond_limit(small_file, reader):
    f, base = _tens_file(small_file, tens_payload("k", 3, [L.MAX_BLOCKS_PER_TENSOR + 1], 1, 0))
    expect(LimitError, reader, f, base)


def _index_payload(codec, body_length, body):
    return bytes([codec]) + varint(body_length) + body


def index_body(payload) -> bytes:
    """The decoded body of an INDX payload (§10: codec u8, body_length varint, stored body)."""
    payload = bytes(payload)
    length, shift, i = 0, 0, 1
    while True:
        length |= (payload[i] & 0x7F) << shift
        shift += 7
        i += 1
        if not payload[i - 1] & 0x80:
            break
    return bytes(arcfmt.codecs.decode(payload[0], payload[i:], length))


@pytest.mark.parametrize("body_length", [L.MAX_INDEX_BYTES + 1, 1 << 40])
@pytest.mark.parametrize("reader", READERS)
def test_index_body_length_beyond_limit(small_file, reader, body_length):
    base, _, d = small_file
    p = parse_file(d)
    body = index_body(p.recs[-1].payload)
    for codec, stored in ((0, body), (1, zstandard.ZstdCompressor().compress(body))):
        f = assemble(p, index_payload=_index_payload(codec, body_length, stored))
        expect(LimitError, reader, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_tensor_count_beyond_limit(small_file, reader):
    base, _, d = small_file
    p = parse_file(d)
    body = bytes(32) + (L.MAX_TENSORS + 1).to_bytes(4, "little") + u64(0)
    f = assemble(p, index_payload=_index_payload(0, len(body), body))
    expect(LimitError, reader, f, base)


def _keyframe_block_file(small_file, stream_codec, stream):
    """The small file with the single keyframe stream of tensor "k" (I8, 4 elements: L = 4) replaced."""
    base, _, d = small_file
    p = parse_file(d)
    blk = blocks_of(p, "k")[0]
    ti = [r.name for r in p.recs if r.type == L.TENS].index("k")
    payload = blck_payload(ti, 0, 4, [], [(stream_codec, stream)])
    return assemble(p, replace(p, lambda r: r is blk, payload)), base


@pytest.mark.parametrize("reader", READERS)
def test_keyframe_block_crafting_helper(small_file, reader):
    # A correct replacement stream decodes: the helper itself is sound.
    f, base = _keyframe_block_file(small_file, 0, np.arange(-2, 2, dtype=np.int8).tobytes())
    assert_bit_exact(reader(f, base), small_file[1])
    f, base = _keyframe_block_file(small_file, 1, zstd_frame(np.arange(-2, 2, dtype=np.int8).tobytes(), fcs=4))
    assert_bit_exact(reader(f, base), small_file[1])


@pytest.mark.parametrize("reader", READERS)
def test_zstd_window_beyond_limit(small_file, reader):
    content = np.arange(-2, 2, dtype=np.int8).tobytes()
    frame = zstd_frame(content, fcs=4, window_log=28)
    assert zstandard.get_frame_parameters(frame).window_size == 1 << 28
    f, base = _keyframe_block_file(small_file, 1, frame)
    expect(LimitError, reader, f, base)
    f, base = _keyframe_block_file(small_file, 1, zstd_frame(content, fcs=4, window_log=27))
    assert_bit_exact(reader(f, base), small_file[1])  # exactly MAX_WINDOW is fine


# ------------------------------------------------------------------------------------- bombs, codecs

@pytest.mark.parametrize("reader", READERS)
def test_zstd_frame_declaring_more_than_the_block_needs(small_file, reader):
    """A decompression bomb: the frame's content size is beyond the stream's decoded length L (§9)."""
    for size in (5, 1000, 64 << 20):
        frame = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(size))
        f, base = _keyframe_block_file(small_file, 1, frame)
        expect(CorruptError, reader, f, base)
    f, base = _keyframe_block_file(small_file, 1, zstd_frame(bytes(4), fcs=1 << 30))
    expect(CorruptError, reader, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_zstd_frame_lying_about_its_content_size(small_file, reader):
    """Frame says L bytes, its blocks expand to 256 MiB: fails without producing them."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    f, base = _keyframe_block_file(small_file, 1, zstd_rle_bomb(4, 256 << 20))
    expect(CorruptError, reader, f, base)
    f, base = _keyframe_block_file(small_file, 1, zstd_frame(bytes(40), fcs=4))
    expect(CorruptError, reader, f, base)
    f, base = _keyframe_block_file(small_file, 1, zstd_frame(bytes(2), fcs=4))
    expect(CorruptError, reader, f, base)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 128 * 1024, f"decoding a bomb grew the process by {grown_kib} KiB"


@pytest.mark.parametrize("reader", READERS)
def test_zstd_frame_rules(small_file, reader):
    content = np.arange(-2, 2, dtype=np.int8).tobytes()
    # No content size in the frame header.
    cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    no_fcs = cobj.compress(content) + cobj.flush()
    assert zstandard.get_frame_parameters(no_fcs).content_size in (0, zstandard.CONTENTSIZE_UNKNOWN)
    for stream in (no_fcs,
                   zstd_frame(content, fcs=4) + zstd_frame(content, fcs=4),                 # second frame
                   zstd_frame(content, fcs=4) + b"\x50\x2a\x4d\x18" + (0).to_bytes(4, "little"),  # skippable
                   zstd_frame(content, fcs=4) + b"\x00",                                     # trailing byte
                   zstd_frame(content, fcs=4)[:-1],                                          # cut short
                   b"\x28\xb5\x2f\xfd",                                                      # header only
                   b"not zstd at all"):
        f, base = _keyframe_block_file(small_file, 1, stream)
        expect(CorruptError, reader, f, base)


@functools.cache
def _bomb(kind: str) -> bytes:
    """16 MiB of zeros, compressed: far beyond the 4 bytes the block's stream decodes to."""
    data = bytes(16 << 20)
    return lzma.compress(data, format=lzma.FORMAT_XZ, preset=1) if kind == "xz" else bz2.compress(data, 1)


@pytest.mark.parametrize("reader", READERS)
def test_xz_and_bz2_bombs_and_rules(small_file, reader):
    content = np.arange(-2, 2, dtype=np.int8).tobytes()
    xz = lambda b: lzma.compress(b, format=lzma.FORMAT_XZ)  # noqa: E731
    f, base = _keyframe_block_file(small_file, 2, xz(content))
    assert_bit_exact(reader(f, base), small_file[1])
    f, base = _keyframe_block_file(small_file, 3, bz2.compress(content))
    assert_bit_exact(reader(f, base), small_file[1])
    for codec, stream in ((2, _bomb("xz")), (3, _bomb("bz2")),
                          (2, xz(bytes(5))), (3, bz2.compress(bytes(5))),
                          (2, xz(bytes(3))), (3, bz2.compress(bytes(3))),
                          (2, xz(content) + b"\x00"), (3, bz2.compress(content) + b"junk"),
                          (2, xz(content) + xz(content)), (3, bz2.compress(content) * 2),
                          (2, xz(content)[:-3]), (3, bz2.compress(content)[:-3]),
                          (2, b"\xfd7zXZ\x00garbage"), (3, b"BZh9garbage")):
        f, base = _keyframe_block_file(small_file, codec, stream)
        expect(CorruptError, reader, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_raw_stream_length_must_match(small_file, reader):
    for stream in (b"", b"\x00" * 3, b"\x00" * 5):
        f, base = _keyframe_block_file(small_file, 0, stream)
        expect(CorruptError, reader, f, base)


@pytest.mark.parametrize("codec", [4, 7, 255])
@pytest.mark.parametrize("reader", READERS)
def test_unknown_codec_id(small_file, reader, codec):
    f, base = _keyframe_block_file(small_file, codec, bytes(4))
    expect(UnsupportedError, reader, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_unknown_index_codec(small_file, reader):
    base, _, d = small_file
    p = parse_file(d)
    good = p.recs[-1].payload
    f = assemble(p, index_payload=bytes([9]) + good[1:])
    expect(UnsupportedError, ra, f, base)
    expect({UnsupportedError, CorruptError}, sr, f, base)


# ------------------------------------------------------------------------------------- BLCK contents

def _w_block_file(small_file, payload, nth=0):
    """The small file with block ``nth`` of tensor "w" (BF16, blocks of 4) replaced by ``payload``."""
    base, _, d = small_file
    p = parse_file(d)
    blk = blocks_of(p, "w")[nth]
    return assemble(p, replace(p, lambda r: r is blk, payload)), base


def _raw(*streams):
    return [(0, bytes(s)) for s in streams]


def _w_base_bits(small_file, nth=0):
    return np.ascontiguousarray(small_file[0]["w"]).view(np.uint16)[4 * nth: 4 * nth + 4]


@pytest.mark.parametrize("reader", READERS)
def test_block_crafting_helper_is_sound(small_file, reader):
    """A hand-built bf16-delta block equal to what the writer chose decodes bit-exactly."""
    base, target, d = small_file
    tb = np.ascontiguousarray(target["w"]).view(np.uint16)[:4]
    bb = _w_base_bits(small_file)
    changed = np.flatnonzero(tb != bb)
    assert changed.tolist() == [1]
    step = int(tb[1]) - int(bb[1])
    f, base = _w_block_file(small_file, blck_payload(0, 0, 2, [1, 0], _raw([1], [step & 0xFF], b"", b"")))
    assert_bit_exact(reader(f, base), target)
    # The same change as xor and as a keyframe (which needs no base) are also valid encodings.
    x = (tb ^ bb).view(np.uint8).reshape(4, 2)
    f, base = _w_block_file(small_file, blck_payload(0, 0, 1, [], _raw(x[:, 0], x[:, 1])))
    assert_bit_exact(reader(f, base), target)


@pytest.mark.parametrize("reader", READERS)
def test_unsupported_encodings(small_file, reader):
    for enc in (12, 13, 255):   # (10 is ctx-delta-rh, 1.9; 11 ctx-delta-rhp, 1.10)
        f, base = _w_block_file(small_file, blck_payload(0, 0, enc, [], []))
        expect(UnsupportedError, reader, f, base)
    # float-delta (3) is not defined for BF16.
    f, base = _w_block_file(small_file, blck_payload(0, 0, 3, [1, 0], _raw([1], [1], b"", b"")))
    expect(UnsupportedError, reader, f, base)
    # bf16-delta (2) and float-delta (3) on an integer tensor; bf16-delta on F32.
    p = parse_file(small_file[2])
    ti = [r.name for r in p.recs if r.type == L.TENS].index("k")
    kb = blocks_of(p, "k")[0]
    for enc in (2, 3):
        f = assemble(p, replace(p, lambda r: r is kb, blck_payload(ti, 0, enc, [1, 0], _raw([0], [1], b"", b""))))
        expect(UnsupportedError, reader, f, small_file[0])
    # ctx-delta (5) on an integer tensor: rejected at the encoding byte, before its params.
    f = assemble(p, replace(p, lambda r: r is kb,
                            blck_payload(ti, 0, 5, [1, 1, 0, 1, 1], _raw(b"\x01", b"", b"\x00", b"\x00"))))
    expect(UnsupportedError, reader, f, small_file[0])
    # dense-delta (6) on an integer tensor: likewise.
    f = assemble(p, replace(p, lambda r: r is kb,
                            blck_payload(ti, 0, 6, [1, 0, 0, 1], _raw(b"", b"", b"\x00", b"\x00"))))
    expect(UnsupportedError, reader, f, small_file[0])
    # ctx-delta-rp (9) on an integer tensor: likewise.
    f = assemble(p, replace(p, lambda r: r is kb, blck_payload(ti, 0, 9, [1, 1, 0, 0, 1, 0, 5], [(0, bytes(5))])))
    expect(UnsupportedError, reader, f, small_file[0])
    ui = [r.name for r in p.recs if r.type == L.TENS].index("u")
    ub = blocks_of(p, "u")[0]
    f = assemble(p, replace(p, lambda r: r is ub, blck_payload(ui, 0, 2, [1, 0], _raw([0], [1, 0, 0], b"", b""))))
    expect(UnsupportedError, reader, f, small_file[0])


@pytest.mark.parametrize("code", [0, 16, 99, 255])
@pytest.mark.parametrize("reader", READERS)
def test_unknown_dtype_code(small_file, reader, code):
    f, base = _tens_file(small_file, tens_payload("k", code, [4], 4, 0))
    expect(UnsupportedError, reader, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_corrupt_delta_blocks(small_file, reader):
    """§8.3/8.4 checks: counts, positions, exception indices, zero steps, mantissa range, exception values."""
    bb = _w_base_bits(small_file)
    mant = int(bb[1]) & 0x7F
    cases = {
        "c=0": blck_payload(0, 0, 2, [0, 0], _raw(b"", b"", b"", b"")),
        "c>m": blck_payload(0, 0, 2, [5, 0], _raw([0, 0, 0, 0, 0], [1] * 5, b"", b"")),
        "e>c": blck_payload(0, 0, 2, [1, 2], _raw([1], b"", [0, 0], [0, 0, 0, 0])),
        "position>=m": blck_payload(0, 0, 2, [1, 0], _raw([4], [1], b"", b"")),
        "gap past m": blck_payload(0, 0, 2, [2, 0], _raw([1, 2], [1, 1], b"", b"")),
        "zero step": blck_payload(0, 0, 2, [1, 0], _raw([1], [0], b"", b"")),
        "step leaves mantissa": blck_payload(0, 0, 2, [1, 0], _raw([1], [(0x80 - mant) & 0xFF], b"", b"")),
        "step below mantissa": blck_payload(0, 0, 2, [1, 0], _raw([1], [(-mant - 1) & 0xFF], b"", b"")),
        "exception index>=c": blck_payload(0, 0, 2, [1, 1], _raw([1], b"", [1], [0, 0x80])),
        "exception keeps sign+exp": blck_payload(
            0, 0, 2, [1, 1], _raw([1], b"", [0], (int(bb[1]) ^ 1).to_bytes(2, "little"))),
        "exception equals base": blck_payload(0, 0, 2, [1, 1], _raw([1], b"", [0], int(bb[1]).to_bytes(2, "little"))),
        "extra bytes": blck_payload(0, 0, 2, [1, 0], _raw([1], [1], b"", b"")) + b"\x00",
        "stream table short": blck_payload(0, 0, 2, [1, 0], _raw([1], [1], b"", b""))[:-1],
        "wrong tensor ordinal": blck_payload(1, 0, 0, [], []),
        "wrong block ordinal": blck_payload(0, 1, 0, [], []),
        "non-minimal varint": b"\x80\x00" + blck_payload(0, 0, 0, [], [])[1:],
        "varint > 10 bytes": b"\x80" * 11 + b"\x00" + blck_payload(0, 0, 0, [], [])[1:],
        "varint >= 2**64": b"\xff" * 9 + b"\x02" + blck_payload(0, 0, 0, [], [])[1:],
        "empty": b"",
        # §9: an empty stream (L = 0) must be raw with stored length 0.
        "empty stream as zstd": blck_payload(0, 0, 2, [1, 0], [(0, b"\x01"), (0, b"\x01"),
                                                            (1, zstandard.ZstdCompressor().compress(b"")), (0, b"")]),
        "empty stream as bz2": blck_payload(0, 0, 2, [1, 0], [(0, b"\x01"), (0, b"\x01"), (0, b""),
                                                           (3, bz2.compress(b""))]),
    }
    for what, payload in cases.items():
        f, base = _w_block_file(small_file, payload)
        got = expect(CorruptError, reader, f, base)
        assert str(got), what


@pytest.mark.parametrize("reader", READERS)
def test_corrupt_keyframe_fields(reader):
    """Keyframe exponent / sign-mantissa fields out of range (§8.5): F16 exponents must be < 2**5 and
    sign|mantissa values < 2**11 (2 bytes each, plane-major)."""
    d = arcfmt.encode(None, {"h": np.float16([1.0, -2.0])})
    p = parse_file(assemble(parse_file(d), header=BLOCK_RECORDS_HEADER))   # its block as a BLCK record
    blk = p.find(L.BLCK)[0]
    for exps, sms in (([32, 15], [0, 0, 0, 0]), ([15, 255], [0, 0, 0, 0]), ([15, 15], [0, 0, 0x08, 0]),
                      ([15, 15], [0, 0, 0, 0xFF])):
        f = assemble(p, replace(p, lambda r: r is blk, blck_payload(0, 0, 4, [], _raw(exps, sms))))
        expect(CorruptError, reader, f, None)


@pytest.mark.parametrize("reader", READERS)
def test_base_needing_block_in_tensor_without_base(small_file, reader):
    base, _, d = small_file
    p = parse_file(d)
    ki = [r.name for r in p.recs if r.type == L.TENS].index("k")
    kb = blocks_of(p, "k")[0]
    for payload in (blck_payload(ki, 0, 0, [], []), blck_payload(ki, 0, 1, [], _raw(bytes(4)))):
        f = assemble(p, replace(p, lambda r: r is kb, payload))
        expect(CorruptError, reader, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_corrupt_tens_records(small_file, reader):
    base, target, d = small_file
    p = parse_file(d)
    rec = tens_of(p, "k")
    cases = {
        "left over": rec.payload + b"\x00",
        "cut": rec.payload[:-1],
        "empty name": tens_payload("", 3, [4], 4, 0),
        "control char": tens_payload("k\n", 3, [4], 4, 0),
        "DEL": tens_payload("k\x7f", 3, [4], 4, 0),
        "bad utf-8": tens_payload(b"k\xff", 3, [4], 4, 0),
        "surrogate": tens_payload(b"k\xed\xa0\x80", 3, [4], 4, 0),
        "overlong": tens_payload(b"\xc0\xaf", 3, [4], 4, 0),
        "block_elems 0": tens_payload("k", 3, [4], 0, 0),
    }
    for what, payload in cases.items():
        f = assemble(p, replace(p, lambda r: r is rec, payload))
        got = outcome(reader, f, base)
        allowed = {CorruptError, LimitError} if what == "block_elems 0" else {CorruptError}
        assert isinstance(got, ArcError) and type(got) in allowed, f"{what}: {got!r}"
    # Two tensors with the same name: "k" renamed to "w" (the index says so too).
    k_hash = records.parse_tensor(rec.payload, "t").target_hash
    f = assemble(p, replace(p, lambda r: r is rec, tens_payload("w", 3, [4], 4, 0, target_hash=k_hash), name="w"))
    expect(CorruptError, reader, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_verification_failure_never_returns_wrong_data(small_file, reader):
    """A well-formed block whose data is not the target's (checksums all valid): `verification`."""
    base, target, d = small_file
    bb = _w_base_bits(small_file)
    step = int(np.ascontiguousarray(target["w"]).view(np.uint16)[1]) - int(bb[1])
    wrong_step = step + 1 if (int(bb[1]) & 0x7F) + step + 1 <= 0x7F else step - 1
    assert wrong_step != 0
    f, base = _w_block_file(small_file, blck_payload(0, 0, 2, [1, 0], _raw([1], [wrong_step & 0xFF], b"", b"")))
    expect(VerificationError, reader, f, base)
    # Keyframe tensor "k" with other values.
    f, base = _keyframe_block_file(small_file, 0, bytes([1, 2, 3, 4]))
    expect(VerificationError, reader, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_target_digest_mismatch(small_file, reader):
    base, _, d = small_file
    p = parse_file(d)
    f = assemble(p, target_digest=bytes(16))
    expect(VerificationError, reader, f, base)


# ------------------------------------------------------------------------------------- index / trailer

def test_index_inconsistent_with_records(small_file):
    base, _, d = small_file
    p = full_index(d)
    idx = p.index
    good = records.build_index(idx)
    assert good == p.recs[-1].payload

    def with_index(mutate):
        entries = [records.IndexEntry(e.name, e.tens_offset, e.tens_size, e.tens_checksum,
                                      [records.BlockRef(b.offset, b.size, b.checksum, b.encoding) for b in e.blocks])
                   for e in idx.entries]
        mutate(entries)
        return assemble(p, index_payload=records.build_index(records.Index(idx.base_digest, idx.target_digest,
                                                                              entries, list(idx.others))))

    def set_(path, value):
        def m(entries):
            obj = entries[path[0]]
            if len(path) == 3:
                obj = obj.blocks[path[1]]
            setattr(obj, path[-1], value)
        return m

    assert_bit_exact(ra(with_index(lambda es: None), base), small_file[1])  # the helper is sound
    w = next(i for i, e in enumerate(idx.entries) if e.name == "w")
    muts = {
        "tens offset": set_((w, "tens_offset"), idx.entries[w].tens_offset + 1),
        "tens size": set_((w, "tens_size"), idx.entries[w].tens_size + 1),
        "tens checksum": set_((w, "tens_checksum"), idx.entries[w].tens_checksum ^ 1),
        "blk offset": set_((w, 0, "offset"), idx.entries[w].blocks[0].offset - 1),
        "blk size": set_((w, 0, "size"), 15),
        "blk size huge": set_((w, 0, "size"), L.MAX_RECORD_PAYLOAD + 17),
        "blk checksum": set_((w, 0, "checksum"), 0),
        "blk encoding": set_((w, 0, "encoding"), 1),
        "name": set_((w, "name"), "v"),
        "name invalid": set_((w, "name"), "a\x01"),
        "dup name": lambda es: setattr(es[1], "name", es[0].name),
        "block missing": lambda es: es[w].blocks.pop(),
        "block extra": lambda es: es[w].blocks.append(es[w].blocks[-1]),
        "order": lambda es: es.reverse(),
        "into META": set_((w, "tens_offset"), 20),
    }
    for what, mut in muts.items():
        f = with_index(mut)
        got = expect({CorruptError, LimitError}, ra, f, base)
        assert got, what
        expect(CorruptError, sr, f, base)
    # Body not consumed exactly / columns running past the body.
    raw_body = index_body(good)
    for body in (raw_body + b"\x00", raw_body[:-1], raw_body[:40], raw_body[:36]):
        f = assemble(p, index_payload=_index_payload(0, len(body), body))
        expect(CorruptError, ra, f, base)
        expect(CorruptError, sr, f, base)


@pytest.mark.parametrize("reader", READERS)
def test_trailer_inconsistent(small_file, reader):
    base, _, d = small_file
    t = L.TRAILER_SIZE
    io_ = int.from_bytes(d[-t: -t + 8], "little")
    isz = int.from_bytes(d[-t + 8: -t + 16], "little")
    for off, val in ((0, io_ + 1), (0, io_ - 1), (8, isz + 1), (8, isz - 1), (0, 0), (8, 0), (0, 1 << 63)):
        f = patch_trailer(d, off, u64(val))
        expect(CorruptError, reader, f, base)
    # index_offset before the end of META, with a size that still ends at the trailer.
    f = patch_trailer(patch_trailer(d, 0, u64(16)), 8, u64(len(d) - t - 16))
    expect(CorruptError, reader, f, base)


def test_data_after_the_trailer(small_file):
    base, _, d = small_file
    expect(TruncatedError, ra, d + b"\x00", base)  # §11: the last 40 bytes are no trailer
    expect(TruncatedError, ra, d + b"x" * 100, base)
    expect(CorruptError, ra, d + d[-L.TRAILER_SIZE:], base)  # a trailer whose index does not end before it
    for extra in (b"\x00", b"x" * 100, d[-L.TRAILER_SIZE:]):
        expect(CorruptError, sr, d + extra, base)  # §12.2: nothing may follow the trailer


# ------------------------------------------------------------------------------------- wrong base

def _wrong_bases(base):
    w = base["w"]
    changed = np.ascontiguousarray(w).view(np.uint16).copy()
    changed[0] ^= 1
    return {
        "values": {**base, "w": changed.view(ml_dtypes.bfloat16)},
        "nan payload": {**base, "w": np.where(np.arange(8) == 3, changed ^ 0x7FC1, changed).astype(np.uint16)
                        .view(ml_dtypes.bfloat16)},
        "dtype": {**base, "w": np.ascontiguousarray(w).view(np.float16)},
        "dtype same bits int": {**base, "w": np.ascontiguousarray(w).view(np.int16)},
        "shape": {**base, "w": w.reshape(2, 4)},
        "shape 2": {**base, "w": np.concatenate([w, w[:1]])},
        "missing": {k: v for k, v in base.items() if k != "w"},
        "other tensor": {**base, "u": np.array([1.5, -2.5], np.float32)},
        "empty": {},
    }


@pytest.mark.parametrize("case", list(_wrong_bases({"w": np.zeros(8, ml_dtypes.bfloat16)})))
@pytest.mark.parametrize("reader", READERS)
def test_wrong_base(small_file, reader, case):
    base, _, d = small_file
    bad = _wrong_bases(base)[case]
    snapshot = {k: np.ascontiguousarray(v).tobytes() for k, v in bad.items()}
    expect(WrongBaseError, reader, d, bad)
    assert {k: np.ascontiguousarray(v).tobytes() for k, v in bad.items()} == snapshot  # base left alone


@pytest.mark.parametrize("reader", READERS)
def test_no_base_for_a_delta(small_file, reader):
    _, _, d = small_file
    expect(WrongBaseError, reader, d, None)


def test_wrong_base_fails_before_any_tensor_is_returned(small_file):
    """§7/§12.3: wrong_base before any output. Random access checks every base first; the streaming reader
    fails on the first tensor needing the missing base before yielding it."""
    base, _, d = small_file
    bad = _wrong_bases(base)["values"]
    with pytest.raises(WrongBaseError):
        arcfmt.decode(bad, d)
    reader = StreamReader(io.BytesIO(d), bad)
    it = iter(reader)
    with pytest.raises(WrongBaseError):
        next(it)
    # A wrong base for the *last* tensor needing one: random access still returns nothing.
    base2 = {"a": np.arange(4, dtype=np.int32), "b": np.arange(5, dtype=np.int32)}
    target2 = {"a": base2["a"] + 1, "b": base2["b"] + 2}
    d2 = arcfmt.encode(base2, target2)
    with pytest.raises(WrongBaseError):
        arcfmt.decode({"a": base2["a"], "b": base2["b"] + 1}, d2)


def test_wrong_base_on_medium_file(medium_file):
    base, _, d = medium_file
    for name in ("t0", "t1", "t2"):
        u = np.ascontiguousarray(base[name]).reshape(-1).view(f"<u{base[name].dtype.itemsize}").copy()
        u[-1] ^= 1
        bad = {**base, name: u.view(base[name].dtype).reshape(base[name].shape)}
        expect(WrongBaseError, ra, d, bad)
        expect(WrongBaseError, sr, d, bad)


def test_output_budget_is_enforced_before_allocating():
    """SPEC.md §12.3/§17: decoding refuses (LimitError) output beyond the caller's budget, naming the
    tensor that crosses it, before any block is decoded; a budget that fits exactly succeeds."""
    base = {"a": np.arange(1000, dtype=np.float32), "b": np.arange(500, dtype=np.float32)}
    target = {"a": base["a"] + 1, "b": base["b"] * 2}
    d = arcfmt.encode(base, target)
    need = 1000 * 4 + 500 * 4
    with pytest.raises(LimitError, match="'b'"):
        arcfmt.DeltaReader(d, max_output_bytes=need - 1).decode_all(base)
    with pytest.raises(LimitError, match="'a'"):
        arcfmt.DeltaReader(d, max_output_bytes=3999).decode_all(base)
    got = arcfmt.DeltaReader(d, max_output_bytes=need).decode_all(base)
    assert got["a"].tobytes() == target["a"].tobytes() and got["b"].tobytes() == target["b"].tobytes()
    # a small file that rebuilds a large tensor (unchanged blocks) is refused by a smaller budget
    z = {"z": np.zeros(1 << 21, np.float32)}
    small = arcfmt.encode(z, z)
    assert len(small) < 4096
    with pytest.raises(LimitError, match="'z'"):
        arcfmt.DeltaReader(small, max_output_bytes=1 << 20).decode_all(z)
