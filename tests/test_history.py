"""The previous step (format 1.9, SPEC.md §7 "History", §8.11 ``ctx-delta-rh``): a file written with
it codes signs in contexts of each element's last change, names that step by hash, and is read only
with it — a missing or wrong previous step is refused before anything is decoded, never misread."""
from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
from test_ctx_delta import CTX_NAMES

import arcfmt
from arcfmt import backend, twins
from arcfmt.encodings import ctx_delta as ctx
from arcfmt.errors import InputError, WrongBaseError
from arcfmt.history import History
from arcfmt.writer import DeltaWriter
from support.cli import run
from support.data import BY_NAME, assert_bit_exact, bits_of, random_values

kernels = backend.compiled()


def _steps(name: str, seed: int, shape=(60, 100), moved: float = 0.3, again: float = 0.3, same: float = 0.9):
    """(previous, base, target) of one dtype: ``moved`` of the elements changed one unit from the
    previous step to the base, ``again`` of them change again, ``same`` of those the same way (momentum),
    and as many others change with a random sign; values of both signs, so ``ord`` matters."""
    dt = BY_NAME[name]
    rng = np.random.default_rng(seed)
    prev = bits_of(random_values(rng, dt, shape)).reshape(-1).copy()
    half = 1 << (dt.bits - 1)
    o = ctx.ordered(ctx_dt(name), prev)
    up = np.where(rng.random(o.size) < 0.5, 1, -1)
    moved_mask = rng.random(o.size) < moved
    ob = np.where(moved_mask, o + up, o).clip(-half, half - 1)
    step = np.where(rng.random(o.size) < same, up, -up)
    again_mask = moved_mask & (rng.random(o.size) < again)
    fresh = ~moved_mask & (rng.random(o.size) < again * moved)
    step = np.where(fresh, np.where(rng.random(o.size) < 0.5, 1, -1), step)
    ot = np.where(again_mask | fresh, ob + step, ob).clip(-half, half - 1)
    arr = [ctx.unordered(ctx_dt(name), x).astype(prev.dtype).view(dt.np).reshape(shape) for x in (o, ob, ot)]
    return {"w": arr[0]}, {"w": arr[1]}, {"w": arr[2]}


def ctx_dt(name):
    from arcfmt.dtypes import from_name
    return from_name(name)


def _write(base, target, **kw) -> tuple[bytes, DeltaWriter]:
    buf = io.BytesIO()
    with DeltaWriter(buf, **kw) as w:
        w.write_tensors((n, base.get(n), t) for n, t in target.items())
    return buf.getvalue(), w


@pytest.mark.parametrize("name", CTX_NAMES)
def test_a_file_with_history_rebuilds_only_with_its_previous_step(name):
    prev, base, target = _steps(name, 7)
    data, w = _write(base, target, previous=prev, force_encoding="ctx-delta-rh")
    assert [b.encoding for t in w.stats for b in t.blocks] == ["ctx-delta-rh"]
    assert_bit_exact(arcfmt.decode(base, data, previous=prev), target)
    assert_bit_exact(dict(arcfmt.StreamReader(io.BytesIO(data), base, previous=prev)), target)
    kept = History.between(prev["w"], base["w"])
    assert_bit_exact(arcfmt.decode(base, data, previous={"w": kept}), target)
    with pytest.raises(WrongBaseError, match="needs the previous step"):
        arcfmt.decode(base, data)
    with pytest.raises(WrongBaseError, match="needs the previous step"):
        list(arcfmt.StreamReader(io.BytesIO(data), base))
    wrong = bits_of(prev["w"]).copy()
    wrong.reshape(-1)[5] ^= 1
    with pytest.raises(WrongBaseError, match="not the previous step"):
        arcfmt.decode(base, data, previous={"w": wrong.view(prev["w"].dtype)})
    with pytest.raises(WrongBaseError, match="expects"):
        arcfmt.decode(base, data, previous={"w": prev["w"].reshape(-1)})
    # a history kept for another base: the hashes name both ends
    with pytest.raises(WrongBaseError, match="leads to another base"):
        arcfmt.decode(base, data, previous={"w": dataclasses.replace(kept, base_hash=kept.base_hash ^ 1)})


def test_history_pays_where_signs_follow_the_last_move_and_costs_nothing_elsewhere():
    """The default writer picks ctx-delta-rh per block where its contexts size the signs smaller by
    more than the record's hash, else ctx-delta-rc, whose record then names no previous step."""
    prev, base, target = _steps("BF16", 3, shape=(200, 300), same=0.95)
    with_prev, w = _write(base, target, previous=prev)
    without, _ = _write(base, target)
    assert [b.encoding for t in w.stats for b in t.blocks] == ["ctx-delta-rh"]
    assert len(with_prev) < 0.95 * len(without)
    # signs that ignore the last move: no history used, the file needs no previous step
    prev2, base2, target2 = _steps("BF16", 4, shape=(200, 300), same=0.5)
    data, w = _write(base2, target2, previous=prev2)
    assert [b.encoding for t in w.stats for b in t.blocks] == ["ctx-delta-rc"]
    assert_bit_exact(arcfmt.decode(base2, data), target2)


def test_what_carries_history():
    """Tensors of the ctx-delta dtypes, of at least 4096 elements, given a previous value of their dtype
    and shape; not in the modes for older readers; forced ctx-delta-rh without one is refused."""
    prev, base, target = _steps("BF16", 5)
    small = {"s": base["w"][:10]}
    data, w = _write({**base, **small}, {**target, "s": target["w"][:10]}, previous={**prev, "s": prev["w"][:10]})
    r = arcfmt.DeltaReader(data)
    assert r.meta.history and r.header("w").needs_history and not r.header("s").needs_history
    data, _ = _write(base, target, previous=prev, compact_index=False)
    assert not arcfmt.DeltaReader(data).meta.history
    assert_bit_exact(arcfmt.decode(base, data), target)
    with pytest.raises(InputError, match="needs the previous step"):
        _write(base, target, force_encoding="ctx-delta-rh")
    with pytest.raises(InputError, match="mapping"):
        DeltaWriter(io.BytesIO(), previous=[1])


def test_apply_in_place_with_the_previous_step():
    prev, base, target = _steps("F32", 9)
    data, _ = _write(base, target, previous=prev, force_encoding="ctx-delta-rh")
    live = {"w": base["w"].copy()}
    with pytest.raises(WrongBaseError):
        list(arcfmt.apply_in_place(live, data))
    assert np.array_equal(bits_of(live["w"]), bits_of(base["w"]))
    list(arcfmt.apply_in_place(live, data, previous=prev))
    assert_bit_exact(live, target)


@pytest.mark.skipif(kernels is None, reason="numba not installed or ARCFMT_JIT=0")
@pytest.mark.parametrize("name", CTX_NAMES)
@pytest.mark.parametrize("same", [0.5, 0.95])
def test_ctx_delta_rh_matches_the_numpy_twins(name, same):
    """The same choice, params and stream from both backends; each decodes the other's."""
    prev, base, target = _steps(name, 11, same=same)
    out = []
    for chosen in (kernels, twins):
        with backend.using(chosen):
            out.append(_write(base, target, previous=prev)[0])
    assert out[0] == out[1]
    with backend.using(twins):
        assert_bit_exact(arcfmt.decode(base, out[0], previous=prev), target)


def test_the_command_line_encodes_and_applies_with_previous(tmp_path):
    from arcfmt.safetensors_io import write_file
    prev, base, target = _steps("F32", 13)
    for n, d in (("p", prev), ("b", base), ("t", target)):
        write_file(str(tmp_path / f"{n}.safetensors"), d)
    run("encode", tmp_path / "b.safetensors", tmp_path / "t.safetensors", "--previous", tmp_path / "p.safetensors",
        "-o", tmp_path / "d.arc", rc=0)
    p = run("apply", tmp_path / "b.safetensors", tmp_path / "d.arc", "-o", tmp_path / "o.safetensors", rc=1)
    assert p.stderr.count("\n") == 1 and "wrong_base" in p.stderr and "previous step" in p.stderr
    assert not (tmp_path / "o.safetensors").exists()
    run("apply", tmp_path / "b.safetensors", tmp_path / "d.arc", "--previous", tmp_path / "b.safetensors",
        "-o", tmp_path / "o.safetensors", rc=1)
    run("apply", tmp_path / "b.safetensors", tmp_path / "d.arc", "--previous", tmp_path / "p.safetensors",
        "-o", tmp_path / "o.safetensors", rc=0)
    assert (tmp_path / "o.safetensors").read_bytes() == (tmp_path / "t.safetensors").read_bytes()
