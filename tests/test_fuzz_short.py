"""A short, seeded run of tools/fuzz.py and a hypothesis-driven build-then-corrupt property."""
from __future__ import annotations

import os
import sys

import numpy as np
from hypothesis import given, settings, strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))

import fuzz  # noqa: E402



def test_short_fuzz_run(tmp_path):
    assert fuzz.main(["--cases", "400", "--chunk", "200", "--workers", "1", "--seed", "3",
                      "--out", str(tmp_path)]) == 0


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), engine=st.sampled_from(["struct", "bytes"]), mseed=st.integers(0, 2**32 - 1))
def test_build_then_corrupt(seed, engine, mseed):
    base, target, good = fuzz.random_file(np.random.default_rng(seed))
    rng = np.random.default_rng(mseed)
    data = fuzz.mutate_struct(rng, good) if engine == "struct" else fuzz.mutate_bytes(rng, good)
    assert fuzz.check_delta(base, target, data, intact=data == good) is None
