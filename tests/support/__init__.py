"""Shared code of the test suite, also used by tools/make_vectors.py and tools/fuzz.py.

- ``support.records`` — record surgery: take a valid file apart, change it, reassemble it with every
  other checksum, index entry and the trailer consistent (the one toolkit; nothing else builds
  crafted files).
- ``support.data`` — seeded dtypes, arrays, (base, target) pairs, bit-exact comparisons, round trips.
- ``support.store`` — pytest fixtures and helpers for the stream tests: the servers, trajectories.
- ``support.faults`` — the fault-injecting HTTP proxy and the zygote that forks killable jobs
  (``python -m support.faults zygote``, with ``tests/`` on the path).
- ``support.servers`` — SeaweedFS, moto and fake-gcs-server on 127.0.0.1
  (``python tests/support/servers.py seaweedfs`` starts one by hand).

The tests import it as ``support`` (``tests/`` is on pytest's ``pythonpath``, pyproject.toml); a tool
puts ``tests/`` on ``sys.path`` through ``tools/_paths.py``. This file imports nothing, so that the
zygote and the tools load only the modules they use.
"""
