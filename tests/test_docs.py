"""The README's examples, run as tests.

Every ```python block of README.md is executed, in order, in one fresh namespace inside a temporary
working directory (the examples make their own small models); then what they computed is checked. The
command-line examples are checked against the real argument parser: every ``arcfmt`` subcommand and
every ``--option`` they show must exist.
"""
from __future__ import annotations

import gc
import importlib.util
import re
import warnings
from pathlib import Path

import arcfmt
from arcfmt.cli import build_parser

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```([\w+-]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def blocks(lang: str | None = None) -> list[str]:
    text = README.read_text(encoding="utf-8")
    return [body for tag, body in FENCE.findall(text) if lang is None or tag == lang]


def test_readme_has_python_examples():
    assert blocks("python"), "README.md has no ```python block to test"


def test_readme_python_examples_run(tmp_path, monkeypatch):
    """The README's examples are self-contained: run them, then check what they computed."""
    monkeypatch.chdir(tmp_path)
    ns = {"__name__": "readme"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # the examples close what they open
        try:
            for k, code in enumerate(blocks("python")):
                if "arcfmt.torch" in code and importlib.util.find_spec("torch") is None:
                    continue   # the torch example needs the [torch] extra
                exec(compile(code, f"README.md python block {k}", "exec"), ns)
            _check(ns, tmp_path)
        finally:
            ns.clear()
            gc.collect()


def _check(ns, tmp_path):
    def same(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

    assert {"base", "target", "delta", "rebuilt", "embed"} <= set(ns), \
        "the README's API example no longer computes what is checked here"
    base, target = ns["base"], ns["target"]
    assert isinstance(ns["delta"], bytes)
    assert set(ns["rebuilt"]) == set(target)
    assert all(same(ns["rebuilt"][n], target[n]) for n in target)
    files = list(tmp_path.glob("*.arc"))
    assert files
    for f in files:
        out = arcfmt.decode(base, f.read_bytes())
        assert all(same(out[n], target[n]) for n in target), f.name
    assert same(ns["embed"], target["embed"])
    if "engine_params" in ns:   # the live follower's engine: at step 32 (= base) through sparse updates
        from arcfmt.arrays import as_numpy
        assert set(ns["engine_params"]) == set(base)
        assert all(same(as_numpy(ns["engine_params"][n]), base[n]) for n in base)


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
