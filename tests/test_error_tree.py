"""One error tree, closed: nothing outside arcfmt.ArcError escapes a public call on a caller's mistake."""
from __future__ import annotations

import io

import numpy as np
import pytest

import arcfmt
from arcfmt.errors import InputError, MissingTensorError

BASE = {"a": np.arange(6, dtype=np.float32)}


@pytest.mark.parametrize("kw", [dict(base_step=2**64), dict(base_step=-1), dict(base_step=2**64 - 1),
                                dict(target_step=True), dict(target_step="3"), dict(workers=0),
                                dict(block_elems=0), dict(effort="huge")])
def test_bad_arguments_are_input_errors(kw):
    with pytest.raises(InputError):
        arcfmt.encode(BASE, BASE, **kw)


def test_forced_encoding_misuse_is_an_input_error():
    with pytest.raises(InputError, match="needs a base"):
        w = arcfmt.DeltaWriter(io.BytesIO(), force_encoding="ctx-delta")
        w.write_tensors([("a", None, BASE["a"])])
    with pytest.raises(InputError):
        arcfmt.DeltaWriter(io.BytesIO(), force_encoding="nope")


def test_a_missing_tensor_is_an_arc_error_and_a_key_error():
    data = arcfmt.encode(BASE, BASE)
    for call in (lambda: arcfmt.DeltaReader(data).header("nope"),
                 lambda: arcfmt.decode(BASE, data, names=["nope"]),
                 lambda: list(arcfmt.apply_in_place({"a": BASE["a"].copy()}, data, names=["nope"]))):
        with pytest.raises(MissingTensorError) as exc:
            call()
        assert isinstance(exc.value, KeyError) and isinstance(exc.value, arcfmt.ArcError)
        assert str(exc.value) == "no tensor 'nope' in this file"


def test_step_none_round_trips_and_the_largest_step_is_kept():
    d = arcfmt.encode(BASE, BASE, base_step=2**64 - 2, target_step=None)
    r = arcfmt.DeltaReader(d)
    assert (r.base_step, r.target_step) == (2**64 - 2, None)
