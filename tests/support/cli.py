"""Running the command line as a user does: ``python -m arcfmt ARGS`` in a child process."""
from __future__ import annotations

import os
import subprocess
import sys

# progress and quiet switches cleared, so that what a test sees does not depend on the caller's shell
QUIET_ENV = {"ARCFMT_QUIET": "", "ARCFMT_NO_PROGRESS": ""}


def run(*args, env=None, rc=None, **kw) -> subprocess.CompletedProcess:
    """``python -m arcfmt ARGS``: text in and out unless ``input`` is bytes (or ``stdout`` is given, which
    then is not captured); ``env`` adds to the environment; ``rc``: the exit code it must have. Other
    keywords go to :func:`subprocess.run`."""
    text = not isinstance(kw.get("input"), bytes) and "stdout" not in kw
    p = subprocess.run([sys.executable, "-m", "arcfmt", *map(str, args)], capture_output="stdout" not in kw,
                       text=text, env={**os.environ, **QUIET_ENV, **(env or {})}, timeout=300, **kw)
    if rc is not None:
        assert p.returncode == rc, (p.returncode, p.stdout, p.stderr)
    return p
