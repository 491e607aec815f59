"""Where the tools find this checkout's code — the one place a tool changes ``sys.path``.

``import _paths`` (first, before anything from arcfmt or the test support) puts on ``sys.path``:

- the repository root: ``arcfmt`` and ``conformance`` from this checkout, installed or not;
- ``tests/``: the ``support`` package the test suite shares with the tools — ``support.records`` (the
  record-surgery toolkit), ``support.data`` (seeded data, ``write_delta``), ``support.servers`` (the
  local object-store servers).

A tool runs as ``python tools/NAME.py`` (so ``tools/`` is ``sys.path[0]`` and ``_paths`` is found); code
that imports a tool as a module puts ``tools/`` on its path first.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")

sys.path[:0] = [ROOT, TESTS]
