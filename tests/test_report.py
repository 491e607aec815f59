"""`arcfmt report`: the HTML page of a delta, tested by parsing what it renders.

The SVG charts are parsed as XML (xml.etree), the page as HTML (html.parser); the numbers drawn are
compared with DeltaReader.describe() and with counts made here from the arrays themselves.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import ml_dtypes
import numpy as np
import pytest

import arcfmt
from arcfmt.report import render_html, render_report, report_figures
from arcfmt.safetensors_io import write_file

SVG = "{http://www.w3.org/2000/svg}"
EVIL = "<script>alert(1)</script>"
QUOTES = "layer.\"x\"&'y'"
CHARTS = ("bytes-chart", "changed-chart", "codec-chart")
# SPEC.md §8: the role of each stream, per encoding (float dtypes for keyframes)
ROLES = {"bf16-delta": ["positions", "steps", "exceptions", "values"],
         "float-delta": ["positions", "steps", "exceptions", "values"],
         "xor": [f"xor plane {k}" for k in range(8)],
         "keyframe": ["exponent", "sign+mantissa"], "unchanged": [],
         "ctx-delta": ["quotients", "remainders", "signs", "magnitudes"]}


def model(seed: int = 0):
    """Base and target with every kind of tensor: BF16 ULP steps (with a few exceptions), F32, ints
    (xor), unchanged, empty, 0-d, several blocks, and hostile names."""
    rng = np.random.default_rng(seed)
    base, target = {}, {}

    def bf16_pair(shape, density):
        b = (rng.standard_normal(shape) * 0.02).astype(ml_dtypes.bfloat16)
        u = b.view(np.uint16).copy()
        hit = rng.random(shape) < density
        u[hit] += 1                               # one unit in the last place: kept
        flip = hit & (rng.random(shape) < 0.05)
        u[flip] ^= 0x8000                         # sign flips: exceptions
        return b, u.view(ml_dtypes.bfloat16)

    base["model.embed_tokens.weight"], target["model.embed_tokens.weight"] = bf16_pair((400, 32), 0.03)
    base["model.layers.0.mlp.up_proj.weight"], target["model.layers.0.mlp.up_proj.weight"] = bf16_pair((128, 64), 0.1)
    base[EVIL], target[EVIL] = bf16_pair((16, 16), 0.2)
    base[QUOTES], target[QUOTES] = bf16_pair((8,), 0.5)
    w = (1 + 0.05 * rng.standard_normal(64)).astype(np.float32)
    base["model.norm.weight"] = w
    target["model.norm.weight"] = np.where(rng.random(64) < 0.3, np.nextafter(w, np.float32(2)), w).astype(np.float32)
    ids = rng.integers(0, 1000, 50, dtype=np.int32)
    base["position_ids"], target["position_ids"] = ids, ids.copy()
    target["position_ids"][[3, 17]] += 5
    frozen = rng.standard_normal(10).astype(np.float16)
    base["frozen"], target["frozen"] = frozen, frozen.copy()
    base["empty"], target["empty"] = np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)
    base["scale"], target["scale"] = np.array(1.5, np.float32), np.array(2.5, np.float32)
    return base, target


def changed_count(b, t) -> int:
    bu = np.ascontiguousarray(b).reshape(-1).view(f"<u{b.dtype.itemsize}")
    tu = np.ascontiguousarray(t).reshape(-1).view(f"<u{t.dtype.itemsize}")
    return int(np.count_nonzero(bu != tu))


@pytest.fixture(scope="module")
def pair():
    return model(0)


@pytest.fixture(scope="module")
def delta(pair):
    base, target = pair
    # small blocks: the embedding has several, so per-tensor sums are tested too
    return arcfmt.encode(base, target, base_step=30, target_step=31, block_elems=4096, effort="fast")


@pytest.fixture(scope="module")
def page(delta):
    return render_report(delta)


# ------------------------------------------------------------------------------------ parsing helpers

def svgs(page: str) -> dict:
    """Every inline <svg> of the page, parsed as XML (each must be well-formed), by id."""
    out = {}
    for m in re.finditer(r"<svg\b.*?</svg>", page, re.S):
        root = ET.fromstring(m.group(0))
        assert root.tag == SVG + "svg"
        out[root.get("id")] = root
    return out


def bars(root) -> list:
    return [g for g in root.iter(SVG + "g") if g.get("class") == "bar"]


def of_class(el, cls: str) -> list:
    return [c for c in el.iter() if c.get("class") == cls]


class Page(HTMLParser):
    """Tags, text and the tensor table of an HTML page."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.tags = []
        self.text = []
        self.rows = []          # table rows: list of (cell text, data-value attr)
        self._cell = None
        self._in_table = self._in_body = False
        self.feed(page)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "table" and attrs.get("id") == "tensor-table":
            self._in_table = True
        elif tag == "tbody":
            self._in_body = True
        elif self._in_table and tag == "tr" and self._in_body:
            self.rows.append([])
        elif self._in_table and tag == "td":
            self._cell = ["", attrs.get("data-value")]

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_table = self._in_body = False
        elif tag == "td" and self._cell is not None:
            self.rows[-1].append((self._cell[0].strip(), self._cell[1]))
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell[0] += data


# ------------------------------------------------------------------------------------ the page

def test_page_is_self_contained_html(page):
    p = Page(page)
    assert page.startswith("<!DOCTYPE html>")
    tags = [t for t, _ in p.tags]
    assert "script" not in tags and "link" not in tags and "img" not in tags and "iframe" not in tags
    assert tags.count("svg") >= 3 and "table" in tags and "style" in tags
    for _, attrs in p.tags:
        assert "src" not in attrs and "href" not in attrs
        assert not any(k.startswith("on") for k in attrs)      # no event handlers
    assert "@import" not in page and "url(http" not in page
    # the only URL is the SVG namespace
    assert set(re.findall(r"https?://[^\"' )]+", page)) == {"http://www.w3.org/2000/svg"}
    again = arcfmt.encode(*model(0), effort="fast")
    assert render_report(again) == render_report(again)       # deterministic: no clock, no randomness


def test_one_bar_per_tensor(page, delta):
    names = arcfmt.DeltaReader(delta).names
    charts = svgs(page)
    for cid in CHARTS:
        assert [g.get("data-name") for g in bars(charts[cid])] == names, cid
    table = Page(page).rows
    assert [r[1][0] for r in table] == names


def test_numbers_match_describe(page, delta, pair):
    base, target = pair
    d = arcfmt.DeltaReader(delta).describe()
    charts = svgs(page)
    by_bytes = {g.get("data-name"): g for g in bars(charts["bytes-chart"])}
    by_changed = {g.get("data-name"): g for g in bars(charts["changed-chart"])}
    by_codec = {g.get("data-name"): g for g in bars(charts["codec-chart"])}
    for t in d["tensors"]:
        name = t["name"]
        # bytes: the segments add up to the tensor's bytes, and each role to its streams' stored bytes
        g = by_bytes[name]
        assert int(g.get("data-bytes")) == t["bytes"]
        segs = of_class(g, "seg")
        assert sum(int(s.get("data-stored")) for s in segs) == t["bytes"]
        want = {}
        for b in t["blocks"]:
            for role, s in zip(ROLES[b["encoding"]], b["streams"]):
                want[role] = want.get(role, 0) + s["stored"]
        got = {s.get("data-role"): int(s.get("data-stored")) for s in segs if s.get("data-role") != "headers"}
        assert got == {k: v for k, v in want.items() if v}, name
        # codec per stream
        cells = {c.get("data-role"): c.get("data-codec") for c in of_class(by_codec[name], "cell")}
        for role in want:
            codecs = {s["codec"] for b in t["blocks"] for r, s in zip(ROLES[b["encoding"]], b["streams"]) if r == role}
            assert cells[role] == (codecs.pop() if len(codecs) == 1 else "mixed")
        # changed: what the file says, and xor blocks counted from their planes; always the true count
        g = by_changed[name]
        assert int(g.get("data-elements")) == t["elements"]
        if t["changed"] is not None:
            assert int(g.get("data-changed")) == t["changed"]
        assert int(g.get("data-changed")) == changed_count(base[name], target[name])
        fill = of_class(g, "fill")
        if t["elements"]:
            assert float(fill[0].get("data-fraction")) == pytest.approx(int(g.get("data-changed")) / t["elements"])
        else:
            assert fill == []
    assert {e for t in d["tensors"] for e in t["encodings"]} >= {"xor", "unchanged"}
    assert {e for t in d["tensors"] for e in t["encodings"]} & {"bf16-delta", "float-delta", "ctx-delta"}
    # the table shows the same numbers
    rows = {r[1][0]: r for r in Page(page).rows}
    for t in d["tensors"]:
        r = rows[t["name"]]
        assert int(r[4][1]) == t["elements"] and int(r[7][1]) == t["bytes"]
        assert int(r[5][1]) == changed_count(base[t["name"]], target[t["name"]])
    # header: identity, and the summary bar covers the whole file
    fig = report_figures(delta)
    assert (fig["file_bytes"], fig["base_digest"], fig["target_digest"]) == \
        (d["file_bytes"], d["base_digest"], d["target_digest"])
    assert sum(fig["bytes_by_role"].values()) == d["file_bytes"]
    parts = of_class(charts["summary-roles"], "part")
    assert sum(int(p.get("data-value")) for p in parts) == d["file_bytes"]
    text = " ".join(Page(page).text)
    for s in (d["base_digest"], d["target_digest"], "30 → 31", "1.0"):
        assert s in text
    assert fig["model_bytes"] == sum(a.nbytes for a in target.values())
    assert f"{100 * d['file_bytes'] / fig['model_bytes']:.2f} %" in text or \
        f"{100 * d['file_bytes'] / fig['model_bytes']:.1f} %" in text


def test_untrusted_names_are_escaped(page):
    assert EVIL not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    p = Page(page)
    assert all(t != "script" for t, _ in p.tags)
    assert any(EVIL in s for s in p.text)                   # shown as text
    assert any(a.get("data-name") == QUOTES for _, a in p.tags)  # attributes survive quotes and &
    charts = svgs(page)
    assert EVIL in [g.get("data-name") for g in bars(charts["bytes-chart"])]
    labels = [el.text for el in of_class(charts["bytes-chart"], "lbl")]
    assert EVIL in labels and QUOTES in labels


def test_empty_and_scalar_tensors(page, delta):
    d = {t["name"]: t for t in arcfmt.DeltaReader(delta).describe()["tensors"]}
    assert d["empty"]["blocks"] == [] and d["scale"]["shape"] == []
    rows = {r[1][0]: r for r in Page(page).rows}
    assert rows["scale"][3][0] == "scalar" and rows["empty"][3][0] == "0×3"
    charts = svgs(page)
    empty = next(g for g in bars(charts["changed-chart"]) if g.get("data-name") == "empty")
    assert "empty tensor" in "".join(empty.itertext())
    seg = of_class(next(g for g in bars(charts["bytes-chart"]) if g.get("data-name") == "empty"), "seg")
    assert [s.get("data-role") for s in seg] == ["headers"]


def test_keyframe_renders(pair):
    base, target = pair
    key = arcfmt.encode(None, target, target_step=31, effort="fast")
    page = render_report(key)
    charts = svgs(page)
    names = arcfmt.DeltaReader(key).names
    for cid in CHARTS:
        assert len(bars(charts[cid])) == len(names)
    # without a base, changes in keyframe blocks are unknown: hatched bars
    unknown = [g.get("data-name") for g in bars(charts["changed-chart"]) if of_class(g, "unknown")]
    assert set(unknown) == {n for n in names if target[n].size}
    fig = report_figures(key)
    assert fig["kind"] == "keyframe" and fig["changed"] is None
    roles = {s.get("data-role") for s in of_class(charts["bytes-chart"], "seg")}
    assert {"exponent", "sign+mantissa", "elements", "headers"} <= roles
    # with a base, they are counted by comparing, and the base is reported as compared
    fig = report_figures(key, base)
    for t in fig["tensors"]:
        assert t["changed"] == changed_count(base[t["name"]], target[t["name"]])
    assert fig["base"]["present"] == len(names) and not fig["base"]["differs"]
    page = render_report(key, base=base)
    assert "compared" in " ".join(Page(page).text)


def test_empty_file_renders():
    page = render_report(arcfmt.encode({}, {}))
    p = Page(page)
    assert "This file holds no tensors." in " ".join(p.text)
    assert not {"bytes-chart", "changed-chart", "codec-chart"} & set(svgs(page))
    assert report_figures(arcfmt.encode({}, {}))["kind"] == "empty"


def test_wrong_base_is_flagged(pair, delta):
    base, _ = pair
    wrong = dict(base)
    wrong["model.norm.weight"] = base["model.norm.weight"] + np.float32(1)
    del wrong["frozen"]
    fig = report_figures(delta, wrong)
    assert fig["base"]["differs"] == ["model.norm.weight"] and fig["base"]["missing"] == ["frozen"]
    page = render_report(delta, base=wrong)
    assert "2 of 9 wrong" in " ".join(Page(page).text)
    assert report_figures(delta, base)["base"]["ok"] == 9


def test_hundreds_of_tensors_are_capped():
    rng = np.random.default_rng(5)
    base = {f"model.layers.{i}.weight": rng.standard_normal(4 + i % 7).astype(np.float32) for i in range(300)}
    target = {k: (v * np.float32(1.5) if i % 3 == 0 else v) for i, (k, v) in enumerate(base.items())}
    delta = arcfmt.encode(base, target, effort="fast")
    fig = report_figures(delta)
    page = render_html(fig)
    for cid in CHARTS:
        assert len(bars(svgs(page)[cid])) == 300
    capped = render_html(fig, max_bars=40, max_rows=100)
    charts = svgs(capped)
    largest = sorted(range(300), key=lambda i: -fig["tensors"][i]["bytes"])[:40]
    for cid in CHARTS:
        drawn = [int(g.get("data-index")) for g in bars(charts[cid])]
        assert drawn == sorted(largest)
    assert len(Page(capped).rows) == 100
    assert "Showing the 40 largest of 300 tensors" in capped and "Showing the 100 largest" in capped


# ------------------------------------------------------------------------------------ command line

def run(*args):
    return subprocess.run([sys.executable, "-m", "arcfmt", *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def files(tmp_path_factory, pair):
    d = tmp_path_factory.mktemp("report")
    base, target = pair
    write_file(str(d / "step0030.safetensors"), base)
    write_file(str(d / "step0031.safetensors"), target)
    p = run("encode", d / "step0030.safetensors", d / "step0031.safetensors", "-o", d / "step31.arc")
    assert p.returncode == 0, p.stderr
    return d


def test_cli_writes_the_report(files):
    out = files / "out" / "r.html"
    out.parent.mkdir()
    p = run("report", files / "step31.arc", "-o", out)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"wrote {out}") and p.stdout.count("\n") == 1
    assert out.read_text(encoding="utf-8") == render_report(str(files / "step31.arc"))
    assert os.listdir(out.parent) == ["r.html"]            # the temporary file was renamed away

    p = run("report", files / "step31.arc", "--base", files / "step0030.safetensors", "-o", out, "--json")
    assert p.returncode == 1 and "--force" in p.stderr and os.listdir(out.parent) == ["r.html"]
    p = run("report", files / "step31.arc", "--base", files / "step0030.safetensors", "-o", out, "--json",
            "--force")
    assert p.returncode == 0, p.stderr
    fig = json.loads(p.stdout)
    d = arcfmt.DeltaReader(open(files / "step31.arc", "rb")).describe()
    assert [t["name"] for t in fig["tensors"]] == [t["name"] for t in d["tensors"]]
    assert [t["bytes"] for t in fig["tensors"]] == [t["bytes"] for t in d["tensors"]]
    assert (fig["base_step"], fig["target_step"]) == (30, 31) and fig["base"]["ok"] == 9
    assert fig["base"]["path"] == str(files / "step0030.safetensors")
    assert "matches" in " ".join(Page(out.read_text(encoding="utf-8")).text)


def test_cli_refuses_a_corrupt_file(files, tmp_path):
    data = bytearray((files / "step31.arc").read_bytes())
    data[len(data) // 2] ^= 0xFF                           # inside a record: its checksum fails
    bad = tmp_path / "bad.arc"
    bad.write_bytes(bytes(data))
    out = tmp_path / "r.html"
    out.write_text("old")
    p = run("report", bad, "-o", out, "--force")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("arcfmt: error (") and p.stderr.count("\n") == 1, p.stderr
    assert out.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["bad.arc", "r.html"]

    p = run("report", tmp_path / "missing.arc", "-o", out)
    assert p.returncode == 1 and p.stderr.startswith("arcfmt: error (io): cannot read")
    p = run("report", files / "step31.arc", "--base", bad, "-o", out, "--force")   # a base that is no checkpoint
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    p = run("report", files / "step31.arc")                            # -o is required
    assert p.returncode == 2


def test_cli_help_has_an_example():
    p = run("report", "--help")
    assert p.returncode == 0 and "arcfmt report step31.arc" in p.stdout
    assert "report" in run("--help").stdout
