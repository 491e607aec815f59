"""Fixtures and settings of the arcfmt test suite; the shared code lives in ``tests/support/``.

Everything is deterministic: models come from seeded numpy generators, and hypothesis runs under
the derandomized ``ci`` profile (loaded by default; override with ``HYPOTHESIS_PROFILE=dev``).

Markers (registered in pyproject.toml, ``--strict-markers``): ``servers`` (starts SeaweedFS, moto or
fake-gcs-server), ``kill`` (SIGKILLs forked processes at kill points) and ``slow``. A test marked
``servers`` or ``kill`` is ``slow`` too (added below), so ``pytest -m "not slow"`` is the quick tier.
"""
from __future__ import annotations

import os

import pytest

pytest.register_assert_rewrite("support")  # before any support module is imported

from hypothesis import HealthCheck, settings  # noqa: E402

from support.data import medium_model, small_model  # noqa: E402

# The stream tests' fixtures (servers, remotes, trajectories) and the fault tests' (proxy, zygote).
pytest_plugins = ["support.store", "support.faults"]

# ------------------------------------------------------------------------------------- hypothesis

settings.register_profile(
    "ci", derandomize=True, max_examples=100, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# ------------------------------------------------------------------------------------- markers


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects anything
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("servers") or item.get_closest_marker("kill"):
            item.add_marker(pytest.mark.slow)


# A fixture a test uses (directly, through another fixture, or with ``request.getfixturevalue``) and
# the mark it then needs: a test that starts a server or the zygote unmarked fails, so the quick tier
# never starts one.
_NEEDS_MARK = {"seaweedfs_server": "servers", "moto_server": "servers", "fake_gcs_server": "servers",
               "zygote": "kill"}


@pytest.fixture(autouse=True)
def _marked_as_it_runs(request):
    yield
    missing = {name: mark for name, mark in _NEEDS_MARK.items()
               if name in request.fixturenames and request.node.get_closest_marker(mark) is None}
    if missing:
        pytest.fail(f"{request.node.nodeid} uses {', '.join(missing)} but is not marked "
                    + " / ".join(sorted({f"@pytest.mark.{m}" for m in missing.values()})), pytrace=False)

# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def small_file():
    """(base, target, delta bytes) of a small valid file with every record kind."""
    return small_model()


@pytest.fixture(scope="session")
def medium_file():
    """A larger file: several tensors and dtypes, multi-block, compressed streams, an empty tensor."""
    return medium_model()
