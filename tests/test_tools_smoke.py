"""The measuring tools of issue 19 run on a tiny trajectory and say what they measured: each in its own
process (``gil_share.py`` replaces library functions with timed ones)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from arcfmt.safetensors_io import write_file
from support.data import BY_NAME, perturb, random_values

BF16 = BY_NAME["BF16"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    """Three BF16 steps of two tensors (one of two ctx-delta blocks), 1 % of the values moving a step."""
    d = tmp_path_factory.mktemp("traj")
    rng = np.random.default_rng(19)
    step = {"w": random_values(rng, BF16, (1024, 600)), "b": random_values(rng, BF16, (4096,))}
    for k in range(3):
        write_file(str(d / f"step{k:04d}.safetensors"), step)
        step = {n: perturb(rng, BF16, v, 0.01) for n, v in step.items()}
    return str(d)


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(TOOLS, args[0]), *args[1:]], capture_output=True,
                          text=True, timeout=600)


def test_gil_share_reports_a_share_and_its_projection(traj):
    p = _tool("gil_share.py", traj, "--pairs", "1", "--repeat", "1", "--cores", "8", "--json")
    assert p.returncode == 0, p.stderr
    rows = {r["phase"]: r for r in json.loads(p.stdout)["rows"]}
    assert set(rows) == {"encode", "decode"}
    for r in rows.values():
        g = r["gil_share"]
        assert 0 <= g < 1 and r["nogil"]["kernels"] > 0
        assert r["projected_speedup"] == pytest.approx(1 / (g + (1 - g) / 8))


def test_py_work_counts_the_same_python_twice_and_names_where_it_runs(traj):
    runs = []
    for _ in range(2):
        p = _tool("py_work.py", traj, "--pairs", "1", "--top", "3", "--json")
        assert p.returncode == 0, p.stderr
        runs.append({r["phase"]: r for r in json.loads(p.stdout)})
    for phase in ("encode", "decode"):
        a, b = runs[0][phase], runs[1][phase]
        assert a["tensors"] == 2 and a["bytecodes"] > 0 and a["calls"] > 0
        assert (a["bytecodes"], a["calls"]) == (b["bytecodes"], b["calls"])   # a count, not a timing
        assert a["bytecodes_per_tensor"] == a["bytecodes"] / 2
        assert len(a["top"]) == 3 and sum(c for _, c in a["top"]) <= a["bytecodes_per_tensor"]
        assert all(f.count(":") == 1 for f, _ in a["top"])   # file:function
    # the decode parses every tensor's record: the reader's parse shows among its functions
    assert any(f.startswith("layout.py:") for f, _ in runs[0]["decode"]["top"])
    # and it counts one decode: here, a plain tracer's count of the same (warm) decode agrees
    import arcfmt
    from arcfmt.safetensors_io import open_checkpoint

    files = sorted(os.path.join(traj, f) for f in os.listdir(traj))
    prev, cur = ({k: np.array(v) for k, v in open_checkpoint(f).tensors().items()} for f in files[-2:])
    delta = arcfmt.encode(prev, cur)
    ops = [0]

    def tracer(frame, event, arg):
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            ops[0] += 1
        return tracer
    for _ in range(3):
        ops[0] = 0
        sys.settrace(tracer)
        try:
            arcfmt.decode(prev, delta, workers=1)
        finally:
            sys.settrace(None)
    assert ops[0] == pytest.approx(runs[0]["decode"]["bytecodes"], rel=0.05)


def test_kernel_ab_against_this_tree_and_against_a_wrong_kernel(traj, tmp_path):
    p = _tool("kernel_ab.py", ROOT, traj, "--pairs", "2", "--rounds", "2")
    assert p.returncode == 0, p.stderr
    row = [line for line in p.stdout.splitlines() if line.startswith(f"| {traj} |")]
    assert len(row) == 1 and row[0].split("|")[2].strip() == "4", p.stdout  # 2 pairs × 2 ctx-delta blocks
    # a tree whose kernel writes one wrong value (status OK): the tool exits with an error, no figures
    other = tmp_path / "other"
    shutil.copytree(os.path.join(ROOT, "arcfmt"), other / "arcfmt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    src = (other / "arcfmt" / "kernels.py").read_text()
    wrong = src.replace("    for t in range(pos.size):\n        out[pos[t]] = nv[t]\n",
                        "    for t in range(pos.size):\n        out[pos[t]] = nv[t]\n    out[pos[0]] ^= 1\n", 1)
    assert wrong != src
    (other / "arcfmt" / "kernels.py").write_text(wrong)
    p = _tool("kernel_ab.py", str(other), traj, "--pairs", "1", "--rounds", "1")
    assert p.returncode != 0 and "decode different bytes" in p.stderr, (p.stdout, p.stderr)


def test_size_levers_accounts_for_every_byte_and_prints_the_bounds(traj):
    """size_levers.py: framing plus stored streams are the file; the three adaptive bounds are printed."""
    import re
    p = _tool("size_levers.py", traj, "2", "--history", "1")
    assert p.returncode == 0, p.stderr
    total = int(re.search(r"-> 2: (\d+) B", p.stdout).group(1))
    frame = int(re.search(r"framing (\d+) B", p.stdout).group(1))
    stored = sum(int(m) for m in re.findall(r"stream \d+\s+(\d+)", p.stdout))
    assert frame + stored == total, p.stdout
    for what in ("positions given the exponent", "signs given the last change's sign", "magnitudes given"):
        assert re.search(re.escape(what) + r".*\s(\d+) B", p.stdout), p.stdout


def test_size_floor_counts_every_stream_of_a_range_coded_file(traj):
    """size_floor.py: the file's bytes are its roles' (ctx-delta-rc's signs and magnitudes as one), and
    its estimates are printed against them."""
    p = _tool("size_floor.py", traj, "--pairs", "1", "--json")
    assert p.returncode == 0, p.stderr
    (r,) = json.loads(p.stdout).values()
    act, est = r["actual"], r["estimate"]
    assert act["changes"] > 0 and act["other"] == 0, act    # the 1 % steps: ctx-delta-rc blocks
    assert sum(v for k, v in act.items() if k != "total") == act["total"]
    assert {"positions:exp", "positions:exp+prev", "signs:prev", "magnitudes:exp"} <= set(est)
    p = _tool("size_floor.py", traj, "--pairs", "1")
    assert p.returncode == 0 and "signs:prev + magnitudes:exp" in p.stdout, p.stderr


def test_bench_without_an_encoding_never_writes_it(tmp_path):
    """bench.py --without dense-delta: the writer never proposes it (a bias moving every step would
    otherwise take it), the files stay bit-exact; an unknown name is a usage error."""
    rng = np.random.default_rng(5)
    b = random_values(rng, BF16, (30_000,))
    moved = b.view(np.uint16) + np.uint16(1)
    keep = rng.choice(30_000, 600, replace=False)   # all but 2 % of the values step by a unit
    moved[keep] = b.view(np.uint16)[keep]
    write_file(str(tmp_path / "step0000.safetensors"), {"b": b})
    write_file(str(tmp_path / "step0001.safetensors"), {"b": moved.view(b.dtype)})
    runs = {}
    for extra in ([], ["--without", "dense-delta"]):
        p = _tool("bench.py", str(tmp_path), "--peers", "", "--repeat", "1", "--breakdown", "--json", *extra)
        assert p.returncode == 0, p.stderr
        t = json.loads(p.stdout)["trajectories"][0]
        runs[bool(extra)] = t
        assert t["methods"]["arcfmt"]["exact"] is True
    assert runs[True]["methods"]["arcfmt"]["bytes"] > runs[False]["methods"]["arcfmt"]["bytes"]
    p = _tool("bench.py", str(tmp_path), "--peers", "", "--without", "nope")
    assert p.returncode == 2 and "no encoding 'nope'" in p.stderr


def test_startup_times_every_command_and_names_what_it_imported(traj):
    p = _tool("startup.py", traj, "--runs", "1", "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)["results"]["this"]
    assert set(res) == {"version", "apply", "encode", "publish keyframe", "publish delta", "publish delta+previous"}
    assert all(r["min_s"] > 0 for r in res.values())
    assert all("ml_dtypes" not in r["imports"].split() for r in res.values())   # what this tree must not pay
    assert "numba" not in res["version"]["imports"] and "arcfmt.store.publisher" in res["publish delta"]["imports"]
