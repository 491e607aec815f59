"""Rollout side: a delta applied straight into live arrays, verified before any byte is overwritten."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import arcfmt


def model(seed=0):
    rng = np.random.default_rng(seed)
    base = {"embed": rng.standard_normal((500, 64)).astype(ml_dtypes.bfloat16),
            "norm": rng.standard_normal(64).astype(np.float32),
            "frozen": rng.standard_normal((10, 10)).astype(ml_dtypes.bfloat16)}
    target = {k: v.copy() for k, v in base.items()}
    u = target["embed"].view(np.uint16).reshape(-1)
    u[rng.choice(u.size, 300, replace=False)] += 1
    target["norm"][3] = 7.0
    return base, target


def test_updates_live_arrays_and_yields_changed_only():
    base, target = model()
    delta = arcfmt.encode(base, target, block_elems=4096)
    live = {k: v.copy() for k, v in base.items()}
    ids = {k: id(v) for k, v in live.items()}
    got = list(arcfmt.apply_in_place(live, delta))
    assert [n for n, _ in got] == ["embed", "norm"]  # "frozen" did not change
    for n, arr in got:
        assert id(arr) == ids[n]  # the caller's own array, updated in place
    for k in target:
        assert live[k].tobytes() == target[k].tobytes()


def test_wrong_base_touches_nothing():
    base, target = model()
    delta = arcfmt.encode(base, target)
    live = {k: v.copy() for k, v in base.items()}
    live["norm"][0] += 1
    before = {k: v.tobytes() for k, v in live.items()}
    with pytest.raises(arcfmt.WrongBaseError):
        list(arcfmt.apply_in_place(live, delta))
    assert {k: v.tobytes() for k, v in live.items()} == before


def test_corrupt_block_leaves_tensor_untouched():
    base, target = model()
    delta = bytearray(arcfmt.encode(base, target, block_elems=4096))
    delta[len(delta) // 2] ^= 0x01  # damage inside a record of the embedding
    live = {k: v.copy() for k, v in base.items()}
    before = {k: v.tobytes() for k, v in live.items()}
    with pytest.raises(arcfmt.ArcError):
        list(arcfmt.apply_in_place(live, bytes(delta)))
    changed_any = [k for k in live if live[k].tobytes() != before[k]]
    assert all(live[k].tobytes() == target[k].tobytes() for k in changed_any)  # only whole, verified tensors


def test_torch_tensors_in_place():
    torch = pytest.importorskip("torch")
    base, target = model()
    delta = arcfmt.encode(base, target)
    live = {"embed": torch.from_numpy(base["embed"].view(np.int16).copy()).view(torch.bfloat16),
            "norm": torch.from_numpy(base["norm"].copy()), "frozen": torch.zeros(10, 10, dtype=torch.bfloat16)}
    live["frozen"].view(torch.int16).copy_(torch.from_numpy(base["frozen"].view(np.int16)))
    list(arcfmt.apply_in_place(live, delta))
    assert live["embed"].view(torch.int16).numpy().tobytes() == target["embed"].tobytes()


def test_two_threads_start_the_large_blocks_early_and_touch_nothing_before_the_checks(monkeypatch):
    """With two threads the large tensor's blocks decode (into private memory) while the small one's base
    is still being checked; every live array is updated exactly as with one thread, and a wrong small
    base still leaves every live array as it was, whatever the early blocks did."""
    from support.data import EarlyProbe, large_after_small

    base, target, delta = large_after_small(21)
    probe = EarlyProbe(monkeypatch)
    live = {k: v.copy() for k, v in base.items()}
    ids = {k: id(v) for k, v in live.items()}
    got = list(arcfmt.apply_in_place(live, delta, workers=2))
    assert probe.seen == [True]
    assert sorted(n for n, _ in got) == ["large", "small"] and all(id(a) == ids[n] for n, a in got)
    assert all(np.array_equal(live[k], target[k]) for k in target)

    live = {k: v.copy() for k, v in base.items()}
    live["small"][0] ^= 2
    before = {k: v.copy() for k, v in live.items()}
    probe.reset()
    with pytest.raises(arcfmt.WrongBaseError, match="'small'"):
        list(arcfmt.apply_in_place(live, delta, workers=2))
    assert probe.seen == [True]   # the large blocks were decoded meanwhile, and nothing of them reached it
    assert all(np.array_equal(live[k], before[k]) for k in live)


def test_live_torch_tensors_are_written_in_place_or_refused():
    """A live torch tensor whose memory numpy cannot view (not contiguous) is refused before anything is
    written — it used to be updated through a copy, the caller's tensor left as it was — and a base
    torch cannot read here (device "meta") is the caller's error, reported in its turn: the same
    error with one thread and two."""
    torch = pytest.importorskip("torch")
    from support.data import large_after_small

    base = {"w": np.arange(64 * 64, dtype=np.float32).reshape(64, 64)}
    delta = arcfmt.encode(base, {"w": base["w"] + 1})
    for workers in (1, 2):
        live = {"w": torch.from_numpy(np.ascontiguousarray(base["w"].T)).t()}   # same values, not contiguous
        with pytest.raises(arcfmt.InputError, match="C-contiguous"):
            list(arcfmt.apply_in_place(live, delta, workers=workers))
        assert torch.equal(live["w"], torch.from_numpy(base["w"]))

    small_base, _, delta = large_after_small(4)
    given = {"small": small_base["small"] + np.uint16(1),   # first in the file, and wrong
             "large": torch.empty(small_base["large"].size, dtype=torch.int16, device="meta")}
    for workers in (1, 2):
        with pytest.raises(arcfmt.WrongBaseError, match="'small'"):
            arcfmt.decode(given, delta, workers=workers)
        with pytest.raises(arcfmt.WrongBaseError, match="'small'"):
            list(arcfmt.apply_in_place(given, delta, workers=workers))
    given["small"] = small_base["small"]
    with pytest.raises(arcfmt.InputError, match="meta"):
        arcfmt.decode(given, delta, workers=2)
