"""`arcfmt report`: the HTML page of a delta, tested by parsing what it renders.

The page is parsed as HTML (html.parser, into a tree whose tags must nest); the numbers drawn are
compared with DeltaReader.describe() and with counts made here from the arrays themselves. The page
must stay within 1 MiB for many tensors and blocks; where Chromium is installed, one test lays the page
out in it (nothing clipped, the table sorts without script).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from html.parser import HTMLParser

import ml_dtypes
import numpy as np
import pytest

import arcfmt
from arcfmt.report import render_html, render_report, report_figures
from arcfmt.safetensors_io import write_file
from support.cli import run

EVIL = "<script>alert(1)</script>"
QUOTES = "layer.\"x\"&'y'"
# SPEC.md §8: the role of each stream, per encoding (float dtypes for keyframes)
ROLES = {"bf16-delta": ["positions", "steps", "exceptions", "values"],
         "float-delta": ["positions", "steps", "exceptions", "values"],
         "xor": [f"xor plane {k}" for k in range(8)],
         "keyframe": ["exponent", "sign+mantissa"], "unchanged": [],
         "ctx-delta": ["quotients", "remainders", "signs", "magnitudes"],
         "dense-delta": ["quotients", "remainders", "signs", "magnitudes"],
         "ctx-delta-as": ["quotients", "remainders", "signs", "magnitudes"],
         "ctx-delta-rc": ["quotients", "remainders", "changes"], "ctx-delta-rp": ["changes"]}


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

VOID = {"meta", "wbr", "input", "br", "hr", "img", "link"}


class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    def get(self, k, default=None):
        return self.attrs.get(k, default)

    @property
    def classes(self):
        return (self.attrs.get("class") or "").split()

    def iter(self):
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def find(self, cls=None, tag=None, **attrs) -> list:
        return [n for n in self.iter() if (cls is None or cls in n.classes) and (tag is None or n.tag == tag)
                and all(n.get(k.replace("_", "-")) == v for k, v in attrs.items())]

    def by_id(self, i):
        found = [n for n in self.iter() if n.get("id") == i]
        assert len(found) <= 1
        return found[0] if found else None


class Page(HTMLParser):
    """The page as a tree (checks that tags nest), its tags, text and the tensor table's rows."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self._cur = self.root
        self.tags = []
        self.text = []
        self.feed(page)
        self.close()
        assert self._cur is self.root, "unclosed tags"
        table = self.root.by_id("tensor-table")
        self.rows = [] if table is None else [
            [(td.text().strip(), td.get("data-value")) for td in tr.find(tag="td")]
            for tr in table.find(tag="tr") if tr.parent.tag == "tbody"]

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        node = Node(tag, attrs, self._cur)
        self._cur.children.append(node)
        if tag not in VOID:
            self._cur = node

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self._cur.tag == tag, f"</{tag}> closes <{self._cur.tag}>"
        self._cur = self._cur.parent

    def handle_data(self, data):
        self.text.append(data)
        self._cur.children.append(data)

    def chart_rows(self, chart_id) -> list:
        chart = self.root.by_id(chart_id)
        return [r for r in chart.children if isinstance(r, Node) and "row" in r.classes and "head" not in r.classes]


def row_name(row) -> str:
    return row.get("data-name")


# ------------------------------------------------------------------------------------ the page

def test_page_is_self_contained_html(page):
    p = Page(page)
    assert page.startswith("<!DOCTYPE html>")
    tags = [t for t, _ in p.tags]
    for bad in ("script", "link", "img", "iframe", "object", "embed", "form", "a"):
        assert bad not in tags, bad
    assert "table" in tags and "style" in tags
    for _, attrs in p.tags:
        assert "src" not in attrs and "href" not in attrs and "action" not in attrs
        assert not any(k.startswith("on") for k in attrs)      # no event handlers
    assert "@import" not in page and "url(" not in page.replace("url(#", "")
    assert not re.findall(r"https?://", page)                  # no URL at all
    again = arcfmt.encode(*model(0), effort="fast")
    assert render_report(again) == render_report(again)       # deterministic: no clock, no randomness


def test_every_tensor_is_drawn_and_listed(page, delta):
    names = arcfmt.DeltaReader(delta).names
    d = {t["name"]: t for t in arcfmt.DeltaReader(delta).describe()["tensors"]}
    p = Page(page)
    assert [r[1][0] for r in p.rows] == names                  # the table: every tensor, in file order
    largest = p.chart_rows("largest-chart")                   # fewer than 30: all, largest first
    assert sorted(map(row_name, largest)) == sorted(names)
    sizes = [int(r.get("data-bytes")) for r in largest]
    assert sizes == sorted(sizes, reverse=True) and sizes == [d[row_name(r)]["bytes"] for r in largest]
    # names are never cut: the whole name is the text of its cell (line breaks only after dots)
    assert {r.find(cls="nm")[0].text() for r in largest} == set(names)
    groups = p.chart_rows("groups-chart")                     # every tensor in one group
    assert sum(int(g.get("data-tensors")) for g in groups) == len(names)
    assert sum(int(g.get("data-bytes")) for g in groups) == sum(t["bytes"] for t in d.values())
    assert "model.layers.*.mlp.up_proj.weight" in [g.get("data-group") for g in groups]


def test_numbers_match_describe(page, delta, pair):
    base, target = pair
    d = arcfmt.DeltaReader(delta).describe()
    p = Page(page)
    rows = {row_name(r): r for r in p.chart_rows("largest-chart")}
    role_codec: dict = {}
    for t in d["tensors"]:
        name = t["name"]
        # bytes: the segments add up to the tensor's bytes, and each role to its streams' stored bytes
        g = rows[name]
        assert int(g.get("data-bytes")) == t["bytes"]
        segs = [s for s in g.find(cls="seg") if s.get("data-role")]
        assert sum(int(s.get("data-stored")) for s in segs) == t["bytes"]
        want: dict = {}
        for b in t["blocks"]:
            for role, s in zip(ROLES[b["encoding"]], b["streams"]):
                want[role] = want.get(role, 0) + s["stored"]
                role_codec.setdefault(role, {}).setdefault(s["codec"], 0)
                role_codec[role][s["codec"]] += s["stored"]
        got = {s.get("data-role"): int(s.get("data-stored")) for s in segs if s.get("data-role") != "headers"}
        assert got == {k: v for k, v in want.items() if v}, name
        # codec per stream role of the tensor
        codecs = {s.get("data-role"): s.get("data-codec") for s in segs if s.get("data-role") != "headers"}
        for role in got:
            chosen = {s["codec"] for b in t["blocks"] for r, s in zip(ROLES[b["encoding"]], b["streams"])
                      if r == role and s["stored"]}
            assert codecs[role] == (chosen.pop() if len(chosen) == 1 else "mixed")
        # changed: what the file says, and xor blocks counted from their planes; always the true count
        assert int(g.get("data-elements")) == t["elements"]
        if t["changed"] is not None:
            assert int(g.get("data-changed")) == t["changed"]
        assert int(g.get("data-changed")) == changed_count(base[name], target[name])
        fill = g.find(cls="fill")
        if t["elements"]:
            assert float(fill[0].get("data-fraction")) == pytest.approx(int(g.get("data-changed")) / t["elements"])
        else:
            assert fill == []
    assert {e for t in d["tensors"] for e in t["encodings"]} >= {"xor", "unchanged"}
    assert {e for t in d["tensors"] for e in t["encodings"]} & {"bf16-delta", "float-delta", "ctx-delta"}
    # the codec chart: per role, the stored bytes of each codec
    chart = {}
    for seg in p.root.by_id("codec-chart").find(cls="seg"):
        chart.setdefault(seg.get("data-role"), {})[seg.get("data-codec")] = int(seg.get("data-stored"))
    assert chart == {r: {c: v for c, v in cs.items() if v} for r, cs in role_codec.items() if sum(cs.values())}
    # the table shows the same numbers
    table = {r[1][0]: r for r in p.rows}
    for t in d["tensors"]:
        r = table[t["name"]]
        assert int(r[3][1]) == t["elements"] and int(r[6][1]) == t["bytes"]
        assert int(r[4][1]) == changed_count(base[t["name"]], target[t["name"]])
    # header: identity, and the summary bar covers the whole file
    fig = report_figures(delta)
    assert (fig["file_bytes"], fig["base_digest"], fig["target_digest"]) == \
        (d["file_bytes"], d["base_digest"], d["target_digest"])
    assert sum(fig["bytes_by_role"].values()) == d["file_bytes"]
    parts = p.root.by_id("summary-roles").find(cls="seg")
    assert sum(int(x.get("data-value")) for x in parts) == d["file_bytes"]
    text = " ".join(p.text)
    for s in (d["base_digest"], d["target_digest"], "30 → 31", "1.0"):
        assert s in text
    assert fig["model_bytes"] == sum(a.nbytes for a in target.values())
    assert f"{100 * d['file_bytes'] / fig['model_bytes']:.2f} %" in text or \
        f"{100 * d['file_bytes'] / fig['model_bytes']:.1f} %" in text


def test_block_histogram_counts_every_block(page, delta, pair):
    base, target = pair
    d = arcfmt.DeltaReader(delta).describe()
    fig = report_figures(delta)
    hist = fig["block_histogram"]
    blocks = [b for t in d["tensors"] for b in t["blocks"]]
    assert sum(h["blocks"] for h in hist) == len(blocks) == fig["block_count"]
    assert sum(h["bytes"] for h in hist) == sum(b["record_bytes"] for b in blocks)
    assert sum(h["elements"] for h in hist) == sum(t["elements"] for t in d["tensors"])
    unchanged = next(h for h in hist if h["label"] == "unchanged")
    assert unchanged["blocks"] >= 1                           # "frozen" and the unchanged int tensor
    rows = Page(page).chart_rows("block-histogram")
    assert [int(r.get("data-blocks")) for r in rows] == [h["blocks"] for h in hist]


def test_the_table_sorts_without_script(page, delta):
    p = Page(page)
    radios = [a for t, a in p.tags if t == "input"]
    assert {a.get("type") for a in radios} == {"radio"} and sum("checked" in a for a in radios) == 1
    ids = {a["id"] for a in radios}
    labels = [a for t, a in p.tags if t == "label"]
    assert {a["for"] for a in labels} == ids                   # every order has its ▲/▼ in a column head
    for i in ids:                                              # and a CSS rule that applies it
        assert f"#{i}:checked~.tablewrap tbody tr{{order:" in page
    d = arcfmt.DeltaReader(delta).describe()["tensors"]
    trs = [tr for tr in p.root.by_id("tensor-table").find(tag="tr") if tr.parent.tag == "tbody"]
    ranks = [dict(kv.split(":") for kv in tr.get("style").split(";")) for tr in trs]
    for key in ("--i", "--n", "--e", "--c", "--f", "--b", "--p"):
        assert sorted(int(r[key]) for r in ranks) == list(range(len(trs)))
    by_bytes = sorted(range(len(trs)), key=lambda k: int(ranks[k]["--b"]))
    assert [d[k]["bytes"] for k in by_bytes] == sorted(t["bytes"] for t in d)
    by_name = sorted(range(len(trs)), key=lambda k: int(ranks[k]["--n"]))
    assert [d[k]["name"] for k in by_name] == sorted(t["name"] for t in d)


def test_series_are_colour_blind_safe_and_distinct():
    from arcfmt import encodings
    from arcfmt.report import _VIRIDIS, CODEC_STYLES, ENCODING_STYLES, ROLE_STYLES
    okabe_ito = {"#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"}
    greys = {"#BBBBBB", "#666666", "#DDDDDD"}
    for table in (ROLE_STYLES, CODEC_STYLES, ENCODING_STYLES):
        styles = list(table.values())
        assert len(set(styles)) == len(styles)                 # no two series drawn alike
        assert {c for c, _ in styles} <= okabe_ito | greys | set(_VIRIDIS)
        assert {p for _, p in styles} <= {"solid", "hatch", "dots", "grid"}
    # within one encoding, the roles differ in colour too (not only in pattern)
    for enc in encodings.registered():
        from arcfmt.dtypes import BY_CODE
        for dt in BY_CODE.values():
            if enc.defined_for(dt):
                cols = [ROLE_STYLES[r.name][0] for r in enc.stream_roles(dt) if r.name in ROLE_STYLES]
                assert len(set(cols)) == len(cols), enc.name


def test_untrusted_names_are_escaped(page):
    assert EVIL not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    p = Page(page)
    assert all(t != "script" for t, _ in p.tags)
    assert any(EVIL in s for s in p.text)                   # shown as text
    assert any(a.get("data-name") == QUOTES for _, a in p.tags)  # attributes survive quotes and &
    names = [r.find(cls="nm")[0].text() for r in p.chart_rows("largest-chart")]
    assert EVIL in names and QUOTES in names


def test_empty_and_scalar_tensors(page, delta):
    d = {t["name"]: t for t in arcfmt.DeltaReader(delta).describe()["tensors"]}
    assert d["empty"]["blocks"] == [] and d["scale"]["shape"] == []
    p = Page(page)
    rows = {r[1][0]: r for r in p.rows}
    assert rows["scale"][2][0] == "F32 · scalar" and rows["empty"][2][0] == "F32 · 0×3"
    empty = next(r for r in p.chart_rows("largest-chart") if row_name(r) == "empty")
    assert "empty" in empty.text()
    assert [s.get("data-role") for s in empty.find(cls="seg") if s.get("data-role")] == ["headers"]


def test_keyframe_renders(pair):
    base, target = pair
    key = arcfmt.encode(None, target, target_step=31, effort="fast")
    page = render_report(key)
    p = Page(page)
    names = arcfmt.DeltaReader(key).names
    rows = p.chart_rows("largest-chart")
    assert len(rows) == len(names) and len(p.rows) == len(names)
    # without a base, changes in keyframe blocks are unknown: hatched bars
    unknown = [row_name(r) for r in rows if r.find(cls="unknown")]
    assert set(unknown) == {n for n in names if target[n].size}
    fig = report_figures(key)
    assert fig["kind"] == "keyframe" and fig["changed"] is None
    assert any(h["label"].startswith("unknown") and h["blocks"] for h in fig["block_histogram"])
    roles = {s.get("data-role") for r in rows for s in r.find(cls="seg")}
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
    assert p.root.by_id("largest-chart") is None and p.root.by_id("tensor-table") is None
    assert report_figures(arcfmt.encode({}, {}))["kind"] == "empty"


def test_wrong_base_is_flagged(pair, delta):
    base, _ = pair
    wrong = dict(base)
    wrong["model.norm.weight"] = base["model.norm.weight"] + np.float32(1)
    del wrong["frozen"]
    fig = report_figures(delta, wrong)
    assert fig["base"]["differs"] == ["model.norm.weight"] and fig["base"]["missing"] == ["frozen"]
    page = render_report(delta, base=wrong)
    p = Page(page)
    alert = [n for n in p.root.iter() if n.get("role") == "alert"]
    assert len(alert) == 1 and "2 of 9 tensors do not match" in alert[0].text()
    assert "model.norm.weight" in alert[0].text() and "frozen" in alert[0].text()
    assert "wrong" in p.root.find(cls="bad")[0].text()
    assert report_figures(delta, base)["base"]["ok"] == 9
    assert 'role="alert"' not in render_report(delta, base=base)


def test_hundreds_of_tensors_are_capped():
    rng = np.random.default_rng(5)
    base = {f"model.layers.{i}.weight": rng.standard_normal(4 + i % 7).astype(np.float32) for i in range(300)}
    target = {k: (v * np.float32(1.5) if i % 3 == 0 else v) for i, (k, v) in enumerate(base.items())}
    delta = arcfmt.encode(base, target, effort="fast")
    fig = report_figures(delta)
    p = Page(render_html(fig))
    assert len(p.rows) == 300 and len(p.chart_rows("largest-chart")) == 30
    capped = render_html(fig, max_bars=40, max_rows=100)
    p = Page(capped)
    largest = sorted(range(300), key=lambda i: (-fig["tensors"][i]["bytes"], i))
    assert [int(r.get("data-index")) for r in p.chart_rows("largest-chart")] == largest[:40]
    assert [r[0][0] for r in p.rows] == [str(i) for i in sorted(largest[:100])]
    assert "lists the 100 largest of 300 tensors" in capped
    groups = p.chart_rows("groups-chart")
    assert [g.get("data-group") for g in groups] == ["model.layers.*.weight"]
    assert int(groups[0].get("data-tensors")) == 300


def many_tensor_pair(tensors: int, elems: int, name=lambda k: f"model.layers.{k // 9}.mlp.experts.{k % 9}.w"):
    rng = np.random.default_rng(11)
    base, target = {}, {}
    for k in range(tensors):
        b = (rng.standard_normal(elems) * 0.02).astype(ml_dtypes.bfloat16)
        u = b.view(np.uint16).copy()
        u[rng.random(elems) < 0.01] += 1
        base[name(k)], target[name(k)] = b, u.view(ml_dtypes.bfloat16)
    return base, target


def test_page_is_at_most_1_mib_for_many_tensors_and_blocks():
    from arcfmt.report import MAX_PAGE_BYTES
    base, target = many_tensor_pair(2400, 1024)
    delta = arcfmt.encode(base, target, block_elems=128, effort="fast")   # 8 blocks a tensor: 19,200
    fig = report_figures(delta)
    assert fig["block_count"] == 2400 * 8
    page = render_html(fig)
    assert len(page.encode("utf-8")) <= MAX_PAGE_BYTES == 1 << 20
    p = Page(page)
    assert 0 < len(p.rows) < 2400
    assert f"largest of {2400:,} tensors" in page               # and says what it left out
    assert sum(int(g.get("data-tensors")) for g in p.chart_rows("groups-chart")) == 2400
    assert sum(int(r.get("data-blocks")) for r in p.chart_rows("block-histogram")) == 2400 * 8
    assert len(render_html(fig, max_bytes=300_000).encode("utf-8")) <= 300_000


def test_page_is_at_most_1_mib_with_the_longest_hostile_names():
    # 1024-byte names (the format's limit) that escape to 5 times their length, each its own group
    base, target = many_tensor_pair(400, 64, name=lambda k: f"{k}." + "&" * 1000 + f".{k}")
    fig = report_figures(arcfmt.encode(base, target, effort="fast"))
    page = render_html(fig)
    assert len(page.encode("utf-8")) <= 1 << 20
    p = Page(page)
    groups = p.chart_rows("groups-chart")
    assert sum(int(g.get("data-tensors")) for g in groups) == 400 and "other" in groups[-1].classes


# ------------------------------------------------------------------------------------ in a browser

def _chromium():
    import shutil
    for exe in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if exe and shutil.which(exe):
            return shutil.which(exe)
    return None


PROBE = """<script>
const out = {clipped: [], overflow: [], order: null};
for (const el of document.querySelectorAll('.nm, td.name, .card .v, th'))
  if (el.scrollWidth > el.clientWidth + 1) out.clipped.push(el.textContent.slice(0, 80));
for (const el of document.querySelectorAll('.tablewrap, .bars'))
  if (el.scrollWidth > el.clientWidth + 1) out.overflow.push(el.id || el.className);
document.getElementById('sort-b-d').checked = true;
const rows = [...document.querySelectorAll('#tensor-table tbody tr')];
rows.sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top);
out.order = rows.map(r => r.dataset.name);
document.body.innerHTML = '<pre id="probe">' + JSON.stringify(out).replace(/</g, '\\\\u003c') + '</pre>';
</script>"""


@pytest.mark.skipif(_chromium() is None, reason="no chromium on PATH (tools/report_shots.py needs one too)")
def test_in_chromium_nothing_is_clipped_and_the_table_sorts(delta, tmp_path):
    """Laid out by a real browser at 1400 px: no name, card or column head cut, no box scrolling
    sideways, and checking the "bytes ▼" radio re-orders the rows by CSS alone."""
    path = tmp_path / "page.html"
    path.write_text(render_report(delta).replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = subprocess.run([_chromium(), "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path}/p",
                          "--window-size=1400,1000", "--dump-dom", path.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert m, dom[-2000:]
    import html as _html
    out = json.loads(_html.unescape(m.group(1)))
    assert out["clipped"] == [] and out["overflow"] == []
    d = arcfmt.DeltaReader(delta).describe()["tensors"]
    assert out["order"] == [t["name"] for t in sorted(d, key=lambda t: (-t["bytes"], -d.index(t)))]


# ------------------------------------------------------------------------------------ command line

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


def test_cli_wrong_base_exits_1_and_says_so(files, tmp_path, pair):
    base, _ = pair
    wrong = dict(base)
    wrong["model.norm.weight"] = base["model.norm.weight"] + np.float32(1)
    write_file(str(tmp_path / "wrong.safetensors"), wrong)
    out = tmp_path / "r.html"
    p = run("report", files / "step31.arc", "--base", tmp_path / "wrong.safetensors", "-o", out)
    assert p.returncode == 1 and p.stdout.count("\n") == 1, (p.stdout, p.stderr)
    assert p.stdout.startswith(f"wrote {out}")                # the page is written: it names the tensors
    assert f"WRONG BASE: 1 of 9 tensors do not match {tmp_path / 'wrong.safetensors'} (1 differs)" in p.stdout
    alert = [n for n in Page(out.read_text(encoding="utf-8")).root.iter() if n.get("role") == "alert"]
    assert len(alert) == 1 and "model.norm.weight" in alert[0].text()
    p = run("report", files / "step31.arc", "--base", tmp_path / "wrong.safetensors", "-o", out, "--force", "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["base"]["differs"] == ["model.norm.weight"]
    assert p.stderr.startswith("arcfmt: WRONG BASE: 1 of 9") and p.stderr.count("\n") == 1


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
