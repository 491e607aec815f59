"""The conformance suite: vectors match their generator, and the reference passes every one."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_vectors_match_generator():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_vectors.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_reference_passes_every_vector():
    from conformance.runner import main

    assert main(["run"]) == 0


def test_every_decoder_rule_has_a_vector():
    from conformance.runner import main

    assert main(["rules"]) == 0


@pytest.mark.slow  # about 25 s
def test_independent_decoder_passes_every_vector():
    """The second decoder, written from SPEC.md alone, rebuilds and refuses exactly as the vectors say."""
    from conformance.runner import main

    assert main(["run", "--impl", "independent", "--timeout", "60"]) == 0
