"""Seeded data for the tests (and the tools): the dtypes of SPEC.md §2, random bit patterns and
weight-like values, (base, target) pairs, bit-exact comparisons, and round trips through both readers.

Everything is deterministic: every maker takes a seed or a ``numpy.random.Generator``.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import ml_dtypes
import numpy as np

import arcfmt

BF16 = ml_dtypes.bfloat16

# ------------------------------------------------------------------------------------- readers

# The streaming reader of SPEC.md §12.2.
StreamReader = arcfmt.StreamReader

# ------------------------------------------------------------------------------------- dtypes


@dataclass(frozen=True)
class DT:
    """One dtype of SPEC.md §2: its name, numpy dtype, width, unsigned view and float layout."""

    name: str
    code: int
    np: np.dtype
    width: int
    kind: str
    E: int = 0
    M: int = 0

    @property
    def uint(self) -> np.dtype:
        return np.dtype(f"<u{self.width}")

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def bits(self) -> int:
        return 8 * self.width

    def __repr__(self) -> str:  # readable pytest ids / hypothesis output
        return self.name


DTYPES = [
    DT("BOOL", 1, np.dtype(np.bool_), 1, "bool"),
    DT("U8", 2, np.dtype("u1"), 1, "uint"),
    DT("I8", 3, np.dtype("i1"), 1, "int"),
    DT("U16", 4, np.dtype("<u2"), 2, "uint"),
    DT("I16", 5, np.dtype("<i2"), 2, "int"),
    DT("U32", 6, np.dtype("<u4"), 4, "uint"),
    DT("I32", 7, np.dtype("<i4"), 4, "int"),
    DT("U64", 8, np.dtype("<u8"), 8, "uint"),
    DT("I64", 9, np.dtype("<i8"), 8, "int"),
    DT("F16", 10, np.dtype("<f2"), 2, "float", 5, 10),
    DT("BF16", 11, np.dtype(ml_dtypes.bfloat16), 2, "float", 8, 7),
    DT("F32", 12, np.dtype("<f4"), 4, "float", 8, 23),
    DT("F64", 13, np.dtype("<f8"), 8, "float", 11, 52),
    DT("F8_E4M3", 14, np.dtype(ml_dtypes.float8_e4m3fn), 1, "float", 4, 3),
    DT("F8_E5M2", 15, np.dtype(ml_dtypes.float8_e5m2), 1, "float", 5, 2),
]
BY_NAME = {d.name: d for d in DTYPES}
FLOAT_DTYPES = [d for d in DTYPES if d.is_float]
INT_DTYPES = [d for d in DTYPES if not d.is_float]


def from_bits(bits, dt: DT) -> np.ndarray:
    """An array of ``dt`` holding exactly the given raw bit patterns (never converted as values)."""
    return np.ascontiguousarray(np.asarray(bits, dtype=np.uint64).astype(dt.uint)).view(dt.np)


def bits_of(a: np.ndarray) -> np.ndarray:
    """The raw bit patterns of an array (same shape), for comparisons that never use float ==."""
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"<u{a.dtype.itemsize}"))


def random_bits(rng: np.random.Generator, dt: DT, shape) -> np.ndarray:
    """Uniformly random bit patterns (every NaN payload, subnormal, ... can appear)."""
    n = int(np.prod(shape, dtype=np.int64))
    u = rng.integers(0, 1 << dt.bits, size=n, dtype=np.uint64, endpoint=False) if dt.bits < 64 else \
        rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)
    return from_bits(u, dt).reshape(shape)


def random_values(rng: np.random.Generator, dt: DT, shape) -> np.ndarray:
    """Weight-like values: normal floats for float dtypes, random bits for the others."""
    if dt.is_float:
        return (rng.standard_normal(shape) * 0.05).astype(dt.np)
    return random_bits(rng, dt, shape)


def perturb(rng: np.random.Generator, dt: DT, base: np.ndarray, density: float) -> np.ndarray:
    """A target from ``base``: about ``density`` of the elements changed.

    Float changes are a mix of small mantissa steps (the common, "kept" case), sign flips, exponent
    changes and arbitrary new bit patterns; integer changes are arbitrary new bit patterns.
    """
    u = bits_of(base).reshape(-1).copy()
    n = u.size
    if n == 0 or density <= 0:
        return u.view(dt.np).reshape(base.shape)
    k = n if density >= 1 else max(1, int(round(n * density)))
    pos = rng.choice(n, size=min(k, n), replace=False)
    t = u.dtype.type
    kinds = rng.integers(0, 4, size=pos.size) if dt.is_float else np.full(pos.size, 3)
    for p, kind in zip(pos.tolist(), kinds.tolist()):
        old = int(u[p])
        if kind == 0:  # small mantissa step inside the same binade (may wrap into an exception)
            mask = (1 << dt.M) - 1
            step = int(rng.integers(1, min(mask, 8) + 1)) * (1 if rng.random() < 0.5 else -1)
            mant = (old & mask) + step
            new = (old & ~mask) | (mant & mask) if 0 <= mant <= mask else old ^ 1
        elif kind == 1:  # sign flip
            new = old ^ (1 << (dt.bits - 1))
        elif kind == 2:  # exponent change
            new = old ^ (1 << dt.M)
        else:
            new = int.from_bytes(rng.bytes(dt.width), "little")
        if new == old:
            new = old ^ 1
        u[p] = t(new & ((1 << dt.bits) - 1))
    return u.view(dt.np).reshape(base.shape)


def make_pair(seed: int, dtype="BF16", shapes=((64,),), density: float = 0.05, names=None):
    """(base, target) dicts of seeded tensors: one tensor per shape, ``density`` of elements changed."""
    dt = BY_NAME[dtype] if isinstance(dtype, str) else dtype
    rng = np.random.default_rng(seed)
    base, target = {}, {}
    for i, shape in enumerate(shapes):
        name = names[i] if names else f"layer.{i}.weight"
        b = random_values(rng, dt, shape)
        base[name] = b
        target[name] = perturb(rng, dt, b, density)
    return base, target


# ------------------------------------------------------------------------------------- comparisons

def assert_same_tensor(got, want, name="") -> None:
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), \
        f"{name}: bytes differ"


def assert_bit_exact(got: dict, want: dict) -> None:
    """Same names, dtypes, shapes and bytes; floats are compared as bit patterns, never with ==."""
    assert set(got) == set(want), f"names {sorted(got)} != {sorted(want)}"
    for name in want:
        assert_same_tensor(got[name], want[name], name)


def stream_decode(delta: bytes, base=None) -> dict:
    """Decode front to back with the streaming reader (no index); returns name -> array."""
    reader = StreamReader(io.BytesIO(delta), base)
    out = {}
    for name, arr in reader:
        assert name not in out
        out[name] = arr
    assert reader.index is not None  # the whole file (index, trailer) was checked
    return out


def roundtrip(base, target, **kw) -> bytes:
    """Encode, then decode both ways (random access and streaming); both must be bit-exact."""
    delta = arcfmt.encode(base, target, **kw)
    assert_bit_exact(arcfmt.decode(base, delta), target)
    assert_bit_exact(stream_decode(delta, base), target)
    return delta


def encodings_of(delta) -> set:
    """Every block encoding name used in a file, from ``DeltaReader.describe()``."""
    desc = arcfmt.DeltaReader(delta).describe()
    return {b["encoding"] for t in desc["tensors"] for b in t["blocks"]}


# ------------------------------------------------------------------------------------- files


def write_delta(base, target, **kw) -> bytes:
    """A delta file from the streaming writer, one thread: ``base`` None (or a tensor missing from it)
    makes keyframe tensors; defaults block_elems 2^20, steps 1 -> 2, effort fast; ``keyframe=True``
    writes every tensor as a keyframe; other keywords go to :class:`arcfmt.DeltaWriter`."""
    buf = io.BytesIO()
    opts = dict(block_elems=kw.pop("block_elems", 1 << 20), base_step=kw.pop("base_step", 1),
                target_step=kw.pop("target_step", 2), effort=kw.pop("effort", "fast"))
    keyframe = kw.pop("keyframe", False)
    with arcfmt.DeltaWriter(buf, workers=1, **opts, **kw) as w:
        w.write_tensors(((n, None if base is None else base.get(n), t) for n, t in target.items()), keyframe=keyframe)
    return buf.getvalue()


def small_model():
    """A few hundred bytes: a note, a 2-block BF16 delta, a keyframe I8 tensor, an unchanged F32 — every
    block in its own BLCK record (no INLINE_BLOCKS, SPEC.md §7), where the crafted faults put them."""
    rng = np.random.default_rng(1234)
    wb = (rng.standard_normal(8) * 0.1).astype(ml_dtypes.bfloat16)
    wt = wb.copy()
    u = bits_of(wt)
    u[1] += 1          # kept mantissa step
    u[6] ^= 0x8000     # sign flip: an exception
    base = {"w": wb, "u": np.array([1.5, -2.0], np.float32)}
    target = {"w": wt, "k": np.arange(-2, 2, dtype=np.int8), "u": base["u"].copy()}
    buf = io.BytesIO()
    with arcfmt.DeltaWriter(buf, base_step=7, target_step=8, block_elems=4, note="t", effort="fast",
                            workers=1, inline_blocks=False) as w:
        w.write_tensors((n, base.get(n), target[n]) for n in target)
    return base, target, buf.getvalue()


def medium_model():
    """A larger file: several tensors and dtypes, multi-block, compressed streams, an empty tensor."""
    rng = np.random.default_rng(99)
    base, target = {}, {}
    for i, (dt, shape) in enumerate([("BF16", (40, 16)), ("F32", (300,)), ("I16", (5, 7)), ("U8", (0, 3))]):
        d = BY_NAME[dt]
        b = random_values(rng, d, shape)
        base[f"t{i}"] = b
        target[f"t{i}"] = perturb(rng, d, b, 0.1)
    target["new"] = (rng.standard_normal(50)).astype(np.float16)
    delta = arcfmt.encode(base, target, block_elems=128, effort="default", workers=1)
    return base, target, delta


def large_after_small(seed: int, large_blocks: int = 2):
    """``(base, target, delta)``: a small tensor, then a large one of ``large_blocks`` blocks that a
    two-thread decode shares with its helpers and starts while it still checks the small one."""
    import arcfmt
    from arcfmt.parallel import SHARED_MIN_ELEMS

    rng = np.random.default_rng(seed)
    base = {"small": rng.integers(0, 1 << 14, 64, dtype=np.uint16),
            "large": rng.integers(0, 1 << 14, large_blocks * SHARED_MIN_ELEMS, dtype=np.uint16)}
    target = {k: v ^ np.uint16(1) for k, v in base.items()}
    return base, target, arcfmt.encode(base, target, block_elems=SHARED_MIN_ELEMS)


class EarlyProbe:
    """Patches the decode pipeline so a test sees the early start: ``began`` is set once a block of
    ``large`` is decoded, and the base check of ``small`` waits for it (``wait_s``) and notes in
    ``seen`` whether it came — what a two-thread decode starts while the checks are made."""

    def __init__(self, monkeypatch, wait_s: float = 10.0) -> None:
        import threading

        from arcfmt import pipeline

        self.began = threading.Event()
        self.seen: list[bool] = []
        self.wait_s = wait_s
        decode_job, check = pipeline._decode_job, pipeline.check_base

        def decoding(th, *args):
            if th.name == "large":
                self.began.set()
            return decode_job(th, *args)

        def checking(th, b):
            if th.name == "small":
                self.seen.append(self.began.wait(self.wait_s))
            return check(th, b)

        monkeypatch.setattr(pipeline, "_decode_job", decoding)
        monkeypatch.setattr(pipeline, "check_base", checking)

    def reset(self, wait_s: float | None = None) -> None:
        self.began.clear()
        self.seen.clear()
        if wait_s is not None:
            self.wait_s = wait_s
