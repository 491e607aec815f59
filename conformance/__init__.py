"""arcfmt conformance suite: vectors (``vectors/``, ``manifest.json``) and a runner (``python -m conformance``)."""
