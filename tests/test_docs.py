"""The README's examples, run as tests.

Every ```python block of README.md is executed, in order, in one namespace that holds small seeded
``base`` and ``target`` models (name -> numpy array, BF16 via ml_dtypes, with an ``embed`` tensor as
the examples use), inside a temporary working directory; then what the examples computed is checked.
The command-line examples are checked against the real argument parser: every ``arcfmt`` subcommand
and every ``--option`` they show must exist.

The API example is not self-contained: it uses ``base`` and ``target`` (with a tensor ``embed``)
without defining them, which this test provides, and it opens files it never closes (the
ResourceWarnings that causes are ignored here).
"""
from __future__ import annotations

import gc
import re
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np

import arcfmt
from arcfmt.cli import build_parser

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```([\w+-]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def blocks(lang: str | None = None) -> list[str]:
    text = README.read_text(encoding="utf-8")
    return [body for tag, body in FENCE.findall(text) if lang is None or tag == lang]


def small_models(seed: int = 0):
    """A base model and its next RL step: a few percent of the BF16 values move by one ULP."""
    rng = np.random.default_rng(seed)
    shapes = {"embed": (256, 32), "layers.0.mlp.weight": (64, 32), "layers.0.norm.weight": (32,)}
    base, target = {}, {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            w = (1 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
            base[name] = w
            target[name] = np.where(rng.random(shape) < 0.3, np.nextafter(w, np.float32(2)), w)
            continue
        b = (rng.standard_normal(shape) * 0.02).astype(ml_dtypes.bfloat16)
        u = b.view(np.uint16).copy()
        u[rng.random(shape) < 0.05] += 1
        base[name], target[name] = b, u.view(ml_dtypes.bfloat16)
    return base, target


def test_readme_has_python_examples():
    assert blocks("python"), "README.md has no ```python block to test"


def test_readme_python_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base, target = small_models()
    ns = {"__name__": "readme", "base": base, "target": target}
    with warnings.catch_warnings():
        # the examples open files without closing them (README change noted in the module docstring)
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            for k, code in enumerate(blocks("python")):
                exec(compile(code, f"README.md python block {k}", "exec"), ns)
            _check(ns, base, target, tmp_path)
        finally:
            ns.clear()
            gc.collect()


def _check(ns, base, target, tmp_path):
    def same(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

    # what the examples computed, checked against the models they were given
    if "delta" in ns:
        assert isinstance(ns["delta"], bytes)
    if "rebuilt" in ns:
        assert set(ns["rebuilt"]) == set(target)
        assert all(same(ns["rebuilt"][n], target[n]) for n in target)
    for f in tmp_path.glob("*.arc"):
        out = arcfmt.decode(base, f.read_bytes())
        assert all(same(out[n], target[n]) for n in target), f.name
    if "emb" in ns:
        assert same(ns["emb"], target["embed"])
    if "name" in ns and "array" in ns:
        assert same(ns["array"], target[ns["name"]])
    assert {"delta", "rebuilt", "emb"} <= set(ns), "the README's API example no longer computes what is checked here"


def _subcommands():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices


def test_readme_command_lines_exist():
    commands = _subcommands()
    seen = 0
    for code in blocks():
        for line in code.splitlines():
            m = re.search(r"(?:^|[\s/])arcfmt\s+([a-z][\w-]*)(.*)", line.split("#", 1)[0])
            if not m:
                continue
            seen += 1
            cmd, rest = m.group(1), m.group(2)
            assert cmd in commands, f"README line {line!r}: no `arcfmt {cmd}` command"
            options = commands[cmd]._option_string_actions
            for opt in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest):
                assert opt in options, f"README line {line!r}: `arcfmt {cmd}` has no option {opt}"
    assert seen >= 5
