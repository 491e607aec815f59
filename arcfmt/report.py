"""A picture of a delta: one self-contained HTML page (HTML and CSS only: no script, no external resource).

``report_figures`` gathers the numbers (everything ``DeltaReader.describe`` gives, grouped by the stream
roles of SPEC.md §8 as the encoding registry names them, plus totals and a histogram of the blocks);
``render_html`` draws them; ``render_report`` does both. The page has a header (identity, size, share
of the model, and a warning when a given base does not match), where the bytes go (by stream role, by
codec, values by encoding), the largest tensors (bytes by stream role, changed fraction), tensors
grouped by name with their numbers as ``*``, the codecs each stream role chose, the blocks by their
changed fraction, and a table of the tensors that sorts by any numeric column without script (a radio
per order and CSS ``order``).

Readable in a browser as it is: names sit in an HTML column that grows and wraps (never clipped),
the table scrolls inside its box, colours are Okabe–Ito and every series also has a pattern. The page
stays within ``MAX_PAGE_BYTES`` (1 MiB) for any file: per-block detail is only ever aggregated
(per tensor, per group, the histogram), and when the table of every tensor would not fit, it lists
the largest and says so (``tools/report_shots.py`` renders and screenshots pages in Chromium).

Everything taken from the file (tensor names above all) is untrusted and is escaped before it is
written into the page.
"""
from __future__ import annotations

import functools
import html
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import __version__, encodings, records
from .arrays import as_uint
from .dtypes import BY_CODE, from_name
from .errors import ArcError, InputError
from .integrity import tensor_hash
from .reader import DeltaReader

# ------------------------------------------------------------------------------------ stream roles

# The roles themselves (SPEC.md §8 names of each stream) come from the encodings (arcfmt.encodings).
HEADERS = "headers"          # TENS records and BLCK headers + stream tables of a tensor
FILE_OVERHEAD = "file overhead"  # file header, META, INDX, trailer, ancillary records

# Okabe & Ito's colour-blind-safe palette; each series also has a pattern (solid, hatch, dots, grid),
# so that two series never depend on hue alone (ctx-delta's roles solid, float-delta's hatched,
# keyframe's dotted, xor planes a viridis ramp under a grid).
BLACK, ORANGE, SKY, GREEN, YELLOW, BLUE, VERMILLION, PURPLE = (
    "#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
_VIRIDIS = ["#440154", "#46327e", "#365c8d", "#277f8e", "#1fa187", "#4ac16d", "#a0da39", "#fde725"]
ROLE_STYLES: dict[str, tuple[str, str]] = {
    "quotients": (BLUE, "solid"), "remainders": (ORANGE, "solid"), "signs": (PURPLE, "solid"),
    "magnitudes": (GREEN, "solid"),
    "positions": (SKY, "hatch"), "steps": (YELLOW, "hatch"), "exceptions": (VERMILLION, "hatch"),
    "values": (BLACK, "hatch"),
    "exponent": (BLUE, "dots"), "sign+mantissa": (ORANGE, "dots"), "elements": (GREEN, "dots"),
    HEADERS: ("#BBBBBB", "solid"), FILE_OVERHEAD: ("#666666", "solid"),
}
ROLE_STYLES.update((f"xor plane {k}", (c, "grid")) for k, c in enumerate(_VIRIDIS))
CODEC_STYLES = {"raw": ("#BBBBBB", "solid"), "zstd": (BLUE, "solid"), "xz": (ORANGE, "solid"),
                "bz2": (PURPLE, "solid"), "mixed": (BLACK, "hatch")}
ENCODING_STYLES = {"unchanged": ("#DDDDDD", "solid"), "ctx-delta": (BLUE, "solid"), "bf16-delta": (SKY, "hatch"),
                   "float-delta": (YELLOW, "hatch"), "xor": (GREEN, "grid"), "keyframe": (VERMILLION, "dots"),
                   "mixed": (BLACK, "hatch")}
# for series the tables do not name (encodings registered by others): colour × a pattern not used above
_FALLBACK_STYLES = [(c, "vline") for c in (BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY, YELLOW, BLACK)]
# numbers between dots (layers, experts) in a tensor name: its group (tensor_groups)
_NUMBERS = re.compile(r"(?<=\.)\d+(?=\.|$)")
# blocks by the share of their values that changed (upper bounds, inclusive), and those not known
BLOCK_BINS = ((0.0, "unchanged"), (1e-4, "≤ 0.01 %"), (1e-3, "0.01 – 0.1 %"), (1e-2, "0.1 – 1 %"),
              (0.1, "1 – 10 %"), (0.5, "10 – 50 %"), (1.0, "50 – 100 %"))
UNKNOWN_BIN = "unknown (keyframe: give --base)"


def stream_roles(dtype_name: str, encoding: str, count: int) -> list[str]:
    """The SPEC.md §8 name of each stream of a block of ``encoding`` for this dtype (the registry's)."""
    try:
        enc = encodings.by_name(encoding)
    except KeyError:
        names = []
    else:
        names = [r.name for r in enc.stream_roles(from_name(dtype_name))]
    if len(names) < count:
        names = names + [f"stream {k}" for k in range(len(names), count)]
    return names[:count]


@functools.lru_cache(maxsize=8)
def _role_order(table: tuple) -> dict:
    """Role → rank: the registered encodings' roles in their trial order (floats' first, widest dtype
    first), then headers and file overhead."""
    dts = sorted(BY_CODE.values(), key=lambda d: (not d.is_float, -d.itemsize, d.code))
    order: dict[str, int] = {}
    for enc in sorted(table, key=lambda e: (e.trial_rank, e.id)):
        for dt in dts:
            if enc.defined_for(dt):
                for r in enc.stream_roles(dt):
                    order.setdefault(r.name, len(order))
    for name in (HEADERS, FILE_OVERHEAD):
        order.setdefault(name, len(order))
    return order


def _role_key(role: str):
    order = _role_order(tuple(encodings.registered()))
    return (order[role], role) if role in order else (len(order), role)


# ------------------------------------------------------------------------------------ figures

class _Opened:
    """A DeltaReader over a path, bytes or a file object; closes the file only if it opened it."""

    def __init__(self, delta):
        self.file = None
        if isinstance(delta, DeltaReader):
            self.reader = delta
            return
        if isinstance(delta, (str, os.PathLike)):
            try:
                self.file = open(delta, "rb")
            except OSError as exc:
                raise InputError(f"cannot read {os.fspath(delta)}: {exc.strerror or exc}") from None
            source = self.file
        else:
            source = delta
        try:
            self.reader = DeltaReader(source)
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.file is not None:
            self.file.close()
            self.file = None

    def __enter__(self):
        return self.reader

    def __exit__(self, *exc):
        self.close()


def _base_mapping(base):
    """``base`` as name → array: None, a mapping, or a checkpoint path (.safetensors file or folder)."""
    if base is None or isinstance(base, Mapping):
        return base, None
    if isinstance(base, (str, os.PathLike)):
        from .safetensors_io import open_checkpoint

        return open_checkpoint(os.fspath(base)).stored(), os.fspath(base)
    raise InputError(f"base must be a mapping of name to array or a checkpoint path, not {type(base).__name__}")


def _block_streams(reader: DeltaReader, name: str, b: int):
    lb = reader.load_block(name, b)
    return lb.info, records.decode_block_streams(lb.payload, lb.info, f"tensor {name!r} block {b}")


def _changed_in_streams(reader: DeltaReader, name: str, b: int, enc) -> int:
    """Changed elements of a block whose streams alone tell them (``xor``: non-zero planes)."""
    info, streams = _block_streams(reader, name, b)
    return enc.changed_in_streams(reader.header(name).dtype, streams)


def _changed_vs_base(reader: DeltaReader, name: str, b: int, base_u: np.ndarray) -> int:
    """Changed elements of any block, by decoding it and comparing with the base slice."""
    th = reader.header(name)
    info, streams = _block_streams(reader, name, b)
    s, e = th.block_range(b)
    out = np.empty(e - s, th.dtype.uint)
    enc = encodings.get(info.encoding)
    enc.decode(th.dtype, info.params, streams, e - s, base_u[s:e] if enc.needs_base else None, out)
    return int(np.count_nonzero(out != base_u[s:e]))


def _base_status(reader: DeltaReader, name: str, base: Mapping):
    """(status, flat unsigned base or None): ok / differs / missing / mismatch / present (keyframe tensors)."""
    th = reader.header(name)
    arr = base.get(name)
    if arr is None:
        return "missing", None
    try:
        dt, shape, u = as_uint(arr)
    except ArcError:
        return "mismatch", None
    if dt is not th.dtype or tuple(shape) != th.shape:
        return "mismatch", None
    if not th.needs_base:
        return "present", u
    return ("ok", u) if tensor_hash(u) == th.base_hash else ("differs", None)


def _block_bin(fraction: float) -> str:
    for bound, label in BLOCK_BINS:
        if fraction <= bound:
            return label
    return BLOCK_BINS[-1][1]  # pragma: no cover


def report_figures(delta, base=None) -> dict:
    """The numbers a report is drawn from (what ``arcfmt report --json`` prints).

    ``delta``: a path, bytes, a binary file object or a DeltaReader. ``base`` (optional): name → array,
    or a checkpoint path; with it every tensor is checked against its base hash, and the changed count of
    blocks the file alone cannot tell (keyframes) is counted by decoding them and comparing.
    Changes in ``xor`` blocks are counted from the file alone (non-zero XOR planes).
    """
    base_map, base_path = _base_mapping(base)
    with _Opened(delta) as reader:
        d = reader.describe()
        tensors = []
        role_totals: dict[str, int] = {}   # bytes
        codec_totals: dict[str, int] = {}  # bytes
        enc_blocks: dict[str, int] = {}
        enc_elements: dict[str, int] = {}
        enc_bytes: dict[str, int] = {}
        hist: dict[str, dict[str, Any]] = {label: dict(label=label, blocks=0, elements=0, bytes=0)
                                           for label in [lb for _, lb in BLOCK_BINS] + [UNKNOWN_BIN]}
        base_summary: dict[str, Any] | None = None  # JSON-like, as the figures are
        if base_map is not None:
            base_summary = dict(path=base_path, ok=0, present=0, differs=[], missing=[], mismatch=[],
                                extra=len([n for n in base_map if n not in reader.entries]))
        for t in d["tensors"]:
            name, dtype = t["name"], t["dtype"]
            th = reader.header(name)
            status, base_u = (None, None)
            if base_map is not None:
                status, base_u = _base_status(reader, name, base_map)
                assert base_summary is not None  # set with base_map
                if status in ("ok", "present"):
                    base_summary[status] += 1
                else:
                    base_summary[status].append(name)
            roles: dict[str, dict] = {}
            stored_total = 0
            changed_parts, sources = [], set()
            for b, blk in enumerate(t["blocks"]):
                s, e = th.block_range(b)
                enc = blk["encoding"]
                enc_blocks[enc] = enc_blocks.get(enc, 0) + 1
                enc_elements[enc] = enc_elements.get(enc, 0) + (e - s)
                enc_bytes[enc] = enc_bytes.get(enc, 0) + blk["record_bytes"]
                for role, st in zip(stream_roles(dtype, enc, len(blk["streams"])), blk["streams"]):
                    r = roles.setdefault(role, dict(role=role, stored=0, decoded=0, codecs={}))
                    r["stored"] += st["stored"]
                    r["decoded"] += st["decoded"]
                    r["codecs"][st["codec"]] = r["codecs"].get(st["codec"], 0) + st["stored"]
                    codec_totals[st["codec"]] = codec_totals.get(st["codec"], 0) + st["stored"]
                    stored_total += st["stored"]
                c = blk["changed"]
                if c is not None:
                    sources.add("file")
                elif (coder := encodings.by_name(enc)).changed_in_streams is not None:
                    c = _changed_in_streams(reader, name, b, coder)
                    sources.add("+".join(sorted({r.part for r in coder.stream_roles(th.dtype)})) or "streams")
                elif base_u is not None:
                    c = _changed_vs_base(reader, name, b, base_u)
                    sources.add("base")
                changed_parts.append(c)
                h = hist[UNKNOWN_BIN if c is None else _block_bin(c / max(e - s, 1))]
                h["blocks"] += 1
                h["elements"] += e - s
                h["bytes"] += blk["record_bytes"]
            changed = None if any(c is None for c in changed_parts) else int(sum(changed_parts))
            streams = sorted(roles.values(), key=lambda r: _role_key(r["role"]))
            for r in streams:
                r["codec"] = next(iter(r["codecs"])) if len(r["codecs"]) == 1 else "mixed"
                role_totals[r["role"]] = role_totals.get(r["role"], 0) + r["stored"]
            header_bytes = t["bytes"] - stored_total
            role_totals[HEADERS] = role_totals.get(HEADERS, 0) + header_bytes
            itemsize = from_name(dtype).itemsize
            tensors.append(dict(
                name=name, dtype=dtype, shape=list(t["shape"]), elements=t["elements"],
                nbytes=t["elements"] * itemsize, needs_base=t["needs_base"], block_elems=t["block_elems"],
                block_count=len(t["blocks"]), encodings=t["encodings"], bytes=t["bytes"],
                header_bytes=header_bytes, streams=streams,
                changed=changed,
                changed_fraction=(changed / t["elements"]) if changed is not None and t["elements"] else None,
                changed_source=("+".join(sorted(sources)) if sources else ("file" if changed is not None else None)),
                base_status=status))
    tensor_bytes = sum(t["bytes"] for t in tensors)
    role_totals[FILE_OVERHEAD] = d["file_bytes"] - tensor_bytes
    model_bytes = sum(t["nbytes"] for t in tensors)
    elements = sum(t["elements"] for t in tensors)
    known = [t for t in tensors if t["changed"] is not None]
    changed = sum(t["changed"] for t in known) if len(known) == len(tensors) else None
    kind = "empty" if not tensors else ("delta" if any(t["needs_base"] for t in tensors) else "keyframe")
    return dict(
        kind=kind, format_version=d["format_version"], file_bytes=d["file_bytes"],
        base_step=d["base_step"], target_step=d["target_step"],
        base_digest=d["base_digest"], target_digest=d["target_digest"], index_bytes=d["index_bytes"],
        model_bytes=model_bytes, ratio_percent=(100 * d["file_bytes"] / model_bytes) if model_bytes else None,
        tensor_count=len(tensors), block_count=sum(t["block_count"] for t in tensors), elements=elements,
        changed=changed, changed_fraction=(changed / elements) if changed is not None and elements else None,
        changed_known_elements=sum(t["elements"] for t in known),
        changed_known=sum(t["changed"] for t in known),
        bytes_by_role={k: role_totals[k] for k in sorted(role_totals, key=_role_key)},
        bytes_by_codec=dict(sorted(codec_totals.items(), key=lambda kv: -kv[1])),
        blocks_by_encoding=enc_blocks, elements_by_encoding=enc_elements, bytes_by_encoding=enc_bytes,
        block_histogram=[h for h in hist.values() if h["blocks"] or h["label"] != UNKNOWN_BIN],
        base=base_summary, tensors=tensors)


# ------------------------------------------------------------------------------------ formatting

def _e(s) -> str:
    """Escape for HTML text and attributes (and XML: noncharacters become U+FFFD)."""
    s = str(s).replace("\ufffe", "\ufffd").replace("\uffff", "\ufffd")
    return html.escape(s, quote=True)


def fmt_bytes(n) -> str:
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def fmt_int(n) -> str:
    return "—" if n is None else f"{int(n):,}"


def fmt_pct(fraction) -> str:
    """A fraction as a percentage with as many digits as a small number needs."""
    if fraction is None:
        return "—"
    p = 100 * fraction
    if p == 0:
        return "0 %"
    if p >= 10:
        return f"{p:.1f} %"
    if p >= 1:
        return f"{p:.2f} %"
    if p >= 0.01:
        return f"{p:.3f} %"
    return f"{p:.2g} %"


def _shape(shape) -> str:
    return "×".join(map(str, shape)) if shape else "scalar"


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _name(name: str) -> str:
    """A tensor name for the page: escaped, with a line-break opportunity after each dot of a long one
    (names wrap between their parts, never clipped)."""
    text = _e(name)
    return text.replace(".", ".<wbr>") if len(name) > 24 else text


def _pct_w(part: float, whole: float) -> str:
    """A CSS width: ``part`` of ``whole`` in percent (0 when there is no whole)."""
    return _num(100 * part / whole) + "%" if whole > 0 else "0%"


# ------------------------------------------------------------------------------------ series styles

class _Styles:
    """CSS classes of the (colour, pattern) series a page draws: each gets one short class (``s0``,
    ``s1``, ...) and one rule, so a thousand segments do not repeat a gradient each."""

    def __init__(self):
        self.classes: dict[tuple[str, str], str] = {}

    def cls(self, style: tuple[str, str]) -> str:
        if style not in self.classes:
            self.classes[style] = f"s{len(self.classes)}"
        return self.classes[style]

    def css(self) -> str:
        return "".join(f".{c}{{background:{_background(*st)}}}" for st, c in self.classes.items())


def _background(colour: str, pattern: str) -> str:
    """A CSS background: the colour, overlaid with the pattern (in white) that tells series apart
    where colour alone would not (colour-blind readers, grey print)."""
    veil = "rgba(255,255,255,.6)"
    layer = {
        "solid": "",
        "hatch": f"repeating-linear-gradient(135deg,transparent 0 4px,{veil} 4px 6px),",
        "dots": f"radial-gradient({veil} 1.3px,transparent 1.7px) 0 0/5px 5px,",
        "grid": f"repeating-linear-gradient(0deg,{veil} 0 1px,transparent 1px 4px),"
                f"repeating-linear-gradient(90deg,{veil} 0 1px,transparent 1px 4px),",
        "vline": f"repeating-linear-gradient(90deg,transparent 0 3px,{veil} 3px 5px),",
    }[pattern]
    return layer + colour


def _series_style(table: Mapping, key: str) -> tuple[str, str]:
    """The (colour, pattern) of a series; keys the tables do not name (encodings registered later)
    get a fixed one from their name, so a page is deterministic."""
    if key in table:
        return table[key]
    return _FALLBACK_STYLES[sum(key.encode("utf-8", "replace")) % len(_FALLBACK_STYLES)]


def _swatch(styles: _Styles, style: tuple[str, str]) -> str:
    return f'<i class="sw {styles.cls(style)}"></i>'


# ------------------------------------------------------------------------------------ bars

def _segments(styles: _Styles, parts: list, whole: float, labels: bool = False) -> str:
    """Segments of one stacked bar: ``parts`` of (key, value, style, title, data attributes); each is
    ``value / whole`` of the bar's box wide. With ``labels``, a segment wide enough names its key."""
    out = []
    for key, v, style, tip, data in parts:
        if v <= 0:
            continue
        w = 100 * v / whole if whole > 0 else 0
        text = f"<b>{_e(key)}</b>" if labels and w >= 9 else ""
        out.append(f'<i class="seg {styles.cls(style)}" style="width:{_num(w)}%" title="{_e(tip)}"{data}>'
                   f'{text}</i>')
    return "".join(out)


def _bar(inner: str, width_pct: str) -> str:
    return f'<span class="track"><span class="stk" style="width:{width_pct}">{inner}</span></span>'


def _role_parts(t_streams: list, header_bytes: int, name: str) -> list:
    parts = []
    for r in t_streams:
        if r["stored"]:
            tip = f"{name} · {r['role']}: {fmt_bytes(r['stored'])} stored, {r['codec']}, from {fmt_bytes(r['decoded'])}"
            parts.append((r["role"], r["stored"], _series_style(ROLE_STYLES, r["role"]), tip,
                          f' data-role="{_e(r["role"])}" data-stored="{r["stored"]}" data-codec="{_e(r["codec"])}"'))
    parts.append((HEADERS, header_bytes, ROLE_STYLES[HEADERS], f"{name} · record headers: {fmt_bytes(header_bytes)}",
                  f' data-role="{HEADERS}" data-stored="{header_bytes}" data-codec=""'))
    return parts


def _main_encoding(encs: list) -> str | None:
    """The encoding a tensor's bar is coloured by: its blocks' ("mixed" for several; unchanged blocks
    do not count where others changed)."""
    encs = [e for e in encs if e != "unchanged"] or list(encs)
    return (encs[0] if len(encs) == 1 else "mixed") if encs else None


def _changed_cell(styles: _Styles, changed, elements: int, encs: list, fmax: float) -> tuple[str, str]:
    """(bar, text) of a changed fraction on a 0..``fmax`` scale, coloured by the encoding."""
    if not elements:
        return '<span class="track"></span>', "empty"
    if changed is None:
        return ('<span class="track"><span class="stk unknown" style="width:100%"></span></span>',
                "unknown (keyframe: give --base)")
    frac = changed / elements
    enc = _main_encoding(encs)
    style = _series_style(ENCODING_STYLES, enc) if enc else ENCODING_STYLES["unchanged"]
    w = _pct_w(min(frac, fmax), fmax) if fmax > 0 else "0%"
    bar = (f'<span class="track"><span class="stk" style="width:{w}"><i class="seg fill {styles.cls(style)}" '
           f'style="width:100%" data-fraction="{frac!r}" title="{_e(enc or "")}"></i></span></span>')
    return bar, f"{fmt_pct(frac)} · {fmt_int(changed)}"


def _largest_chart(styles: _Styles, fig: dict, cap: int) -> str:
    """The ``cap`` largest tensors, largest first: bytes by stream role, and changed fraction."""
    tensors = fig["tensors"]
    order = sorted(range(len(tensors)), key=lambda i: (-tensors[i]["bytes"], i))[:cap]
    bmax = max((tensors[i]["bytes"] for i in order), default=1) or 1
    fmax = max((tensors[i]["changed_fraction"] or 0 for i in order), default=0)
    file_bytes = max(fig["file_bytes"], 1)
    rows = []
    for i in order:
        t = tensors[i]
        seg = _segments(styles, _role_parts(t["streams"], t["header_bytes"], t["name"]), t["bytes"])
        cbar, ctext = _changed_cell(styles, t["changed"], t["elements"], t["encodings"], fmax)
        rows.append(f'<div class="row" data-index="{i}" data-name="{_e(t["name"])}" data-bytes="{t["bytes"]}" '
                    f'data-elements="{t["elements"]}" data-changed="{"" if t["changed"] is None else t["changed"]}">'
                    f'<span class="nm">{_name(t["name"])}</span>{_bar(seg, _pct_w(t["bytes"], bmax))}'
                    f'<span class="val">{_e(fmt_bytes(t["bytes"]))} · {_e(fmt_pct(t["bytes"] / file_bytes))}</span>'
                    f'{cbar}<span class="val">{_e(ctext)}</span></div>')
    head = (f'<div class="row head"><span>tensor</span><span>bytes by stream role (longest: '
            f'{_e(fmt_bytes(bmax))})</span><span>bytes · % of file</span><span>changed values '
            f'(longest: {_e(fmt_pct(fmax))})</span><span>changed</span></div>')
    return f'<div class="bars five" id="largest-chart">{head}{"".join(rows)}</div>'


def group_key(name: str) -> str:
    """A tensor's group: its name with the numbers between dots (layers, experts) as ``*``."""
    return _NUMBERS.sub("*", name)


def tensor_groups(fig: dict) -> list[dict]:
    """Tensors summed by :func:`group_key`, largest first: count, bytes by role, values, changed."""
    groups: dict[str, dict] = {}
    for i, t in enumerate(fig["tensors"]):
        g = groups.setdefault(group_key(t["name"]), dict(
            group=group_key(t["name"]), tensors=0, first=i, bytes=0, header_bytes=0, elements=0,
            changed=0, changed_known=True, roles={}, codecs={}, encodings=set()))
        g["tensors"] += 1
        g["bytes"] += t["bytes"]
        g["header_bytes"] += t["header_bytes"]
        g["elements"] += t["elements"]
        if t["changed"] is None:
            if t["elements"]:
                g["changed_known"] = False
        else:
            g["changed"] += t["changed"]
        g["encodings"].update(t["encodings"])
        for r in t["streams"]:
            g["roles"][r["role"]] = g["roles"].get(r["role"], 0) + r["stored"]
            for c, s in r["codecs"].items():
                g["codecs"][c] = g["codecs"].get(c, 0) + s
    return sorted(groups.values(), key=lambda g: (-g["bytes"], g["first"]))


def _groups_chart(styles: _Styles, fig: dict, cap: int) -> tuple[str, int]:
    groups = tensor_groups(fig)
    shown, rest = groups[:cap], groups[cap:]
    if rest:
        other: dict[str, Any] = dict(group=f"{len(rest)} more groups", tensors=0, bytes=0, header_bytes=0, elements=0,
                     changed=0, changed_known=True, roles={}, codecs={}, encodings=set(), other=True)
        for g in rest:
            for k in ("tensors", "bytes", "header_bytes", "elements", "changed"):
                other[k] += g[k]
            other["changed_known"] &= g["changed_known"]
            other["encodings"] |= g["encodings"]
            for d in ("roles", "codecs"):
                for k, v in g[d].items():
                    other[d][k] = other[d].get(k, 0) + v
        shown = shown + [other]
    bmax = max((g["bytes"] for g in shown), default=1) or 1
    fracs = [g["changed"] / g["elements"] for g in shown if g["changed_known"] and g["elements"]]
    fmax = max(fracs, default=0)
    file_bytes = max(fig["file_bytes"], 1)
    rows = []
    for g in shown:
        label = g["group"]
        parts = [(role, v, _series_style(ROLE_STYLES, role), f"{label} · {role}: {fmt_bytes(v)}",
                  f' data-role="{_e(role)}" data-stored="{v}"')
                 for role, v in sorted(g["roles"].items(), key=lambda kv: _role_key(kv[0]))]
        parts.append((HEADERS, g["header_bytes"], ROLE_STYLES[HEADERS], f"{label} · headers: "
                      f"{fmt_bytes(g['header_bytes'])}", f' data-role="{HEADERS}" data-stored="{g["header_bytes"]}"'))
        codec_total = sum(g["codecs"].values())
        codecs = ", ".join(f"{c} {fmt_pct(v / codec_total)}" for c, v in
                           sorted(g["codecs"].items(), key=lambda kv: -kv[1])) if codec_total else "—"
        cbar, ctext = _changed_cell(styles, g["changed"] if g["changed_known"] else None, g["elements"],
                                    sorted(g["encodings"]), fmax)
        count = f'<small>{g["tensors"]} tensor{"s" if g["tensors"] != 1 else ""}</small>'
        rows.append(f'<div class="row{" other" if g.get("other") else ""}" data-group="{_e(label)}" '
                    f'data-tensors="{g["tensors"]}" data-bytes="{g["bytes"]}">'
                    f'<span class="nm">{_name(label)} {count}</span>'
                    f'{_bar(_segments(styles, parts, g["bytes"]), _pct_w(g["bytes"], bmax))}'
                    f'<span class="val">{_e(fmt_bytes(g["bytes"]))} · {_e(fmt_pct(g["bytes"] / file_bytes))}</span>'
                    f'{cbar}<span class="val">{_e(ctext)}</span><span class="val codecs">{_e(codecs)}</span></div>')
    head = ('<div class="row head"><span>group (numbers as *)</span><span>bytes by stream role</span>'
            '<span>bytes · % of file</span><span>changed values</span><span>changed</span>'
            '<span>codecs (share of stream bytes)</span></div>')
    return f'<div class="bars six" id="groups-chart">{head}{"".join(rows)}</div>', len(rest)


def _codec_chart(styles: _Styles, fig: dict) -> str:
    """Per stream role: its stored bytes split by the codec the blocks chose."""
    per_role: dict[str, dict[str, int]] = {}
    streams: dict[str, int] = {}
    for t in fig["tensors"]:
        for r in t["streams"]:
            d = per_role.setdefault(r["role"], {})
            for c, s in r["codecs"].items():
                d[c] = d.get(c, 0) + s
            streams[r["role"]] = streams.get(r["role"], 0) + 1
    if not per_role:
        return '<p class="note">No streams: nothing changed.</p>'
    bmax = max(sum(d.values()) for d in per_role.values()) or 1
    rows = []
    for role in sorted(per_role, key=_role_key):
        d = per_role[role]
        total = sum(d.values())
        parts = [(c, v, _series_style(CODEC_STYLES, c), f"{role}: {c} {fmt_bytes(v)} ({fmt_pct(v / max(total, 1))})",
                  f' data-role="{_e(role)}" data-codec="{_e(c)}" data-stored="{v}"')
                 for c, v in sorted(d.items(), key=lambda kv: -kv[1])]
        text = ", ".join(f"{c} {fmt_pct(v / total)}" for c, v, *_ in parts) if total else "empty"
        sw = _swatch(styles, _series_style(ROLE_STYLES, role))
        rows.append(f'<div class="row" data-role="{_e(role)}"><span class="nm">{sw}'
                    f'{_e(role)} <small>{streams[role]} tensors</small></span>'
                    f'{_bar(_segments(styles, parts, total, labels=True), _pct_w(total, bmax))}'
                    f'<span class="val">{_e(fmt_bytes(total))}</span><span class="val">{_e(text)}</span></div>')
    head = ('<div class="row head"><span>stream role</span><span>stored bytes by codec</span><span>bytes</span>'
            '<span>codec shares</span></div>')
    return f'<div class="bars four" id="codec-chart">{head}{"".join(rows)}</div>'


def _histogram(styles: _Styles, fig: dict) -> str:
    """Blocks by changed fraction (the per-block detail, aggregated)."""
    hist = fig["block_histogram"]
    bmax = max((h["blocks"] for h in hist), default=1) or 1
    rows = []
    style = ENCODING_STYLES["ctx-delta"]
    for h in hist:
        if h["label"].startswith("unknown"):
            inner = '<i class="seg unknown" style="width:100%"></i>'
        else:
            inner = f'<i class="seg {styles.cls(style)}" style="width:100%"></i>'
        rows.append(f'<div class="row" data-bin="{_e(h["label"])}" data-blocks="{h["blocks"]}">'
                    f'<span class="nm">{_e(h["label"])}</span>{_bar(inner, _pct_w(h["blocks"], bmax))}'
                    f'<span class="val">{fmt_int(h["blocks"])} blocks</span>'
                    f'<span class="val">{_e(fmt_int(h["elements"]))} values · {_e(fmt_bytes(h["bytes"]))}</span></div>')
    head = ('<div class="row head"><span>changed values in the block</span><span>blocks</span><span>blocks</span>'
            '<span>their values · their bytes</span></div>')
    return f'<div class="bars four" id="block-histogram">{head}{"".join(rows)}</div>'


def _stacked(styles: _Styles, svg_id: str, items: list, label: str, fmt) -> str:
    """A 100 % bar of (key, value, style) items, each named in it where there is room, and a legend
    with every value below it."""
    total = sum(v for _, v, _ in items)
    parts = [(key, v, st, f"{key}: {fmt(v)} ({fmt_pct(v / total)})", f' data-key="{_e(key)}" data-value="{v}"')
             for key, v, st in items]
    bar = (f'<div class="whole" id="{svg_id}">{_segments(styles, parts, total, labels=True)}</div>' if total > 0
           else f'<div class="whole" id="{svg_id}"><span class="note">nothing</span></div>')
    legend = "".join(
        f'<span class="key">{_swatch(styles, st)}{_e(key)} <b>{_e(fmt(v))}</b>'
        f'<small>{_e(fmt_pct(v / total)) if total else ""}</small></span>'
        for key, v, st in items if v > 0)
    return f'<div class="stack"><div class="stacklabel">{_e(label)}</div>{bar}<div class="legend">{legend}</div></div>'


def _legend(styles: _Styles, keys, table, title: str = "") -> str:
    return '<div class="legend">' + (f"<strong>{_e(title)}</strong>" if title else "") + "".join(
        f'<span class="key">{_swatch(styles, _series_style(table, k))}{_e(k)}</span>' for k in keys) + "</div>"


# ------------------------------------------------------------------------------------ the table

# sort keys of the table: (key, column, label of the default direction first)
_SORTS = (("i", "#"), ("n", "tensor"), ("e", "elements"), ("c", "changed"), ("f", "changed %"),
          ("b", "bytes"), ("p", "bits / changed"))


def _ranks(tensors: list, rows: list) -> dict[str, dict[int, int]]:
    """Per sort key, each shown row's rank (0 first) in ascending order; unknowns first."""
    def val(t, k, i):
        if k == "i":
            return (0, i)
        if k == "n":
            return (0, t["name"], i)
        if k == "e":
            return (0, t["elements"], i)
        if k == "c":
            return (0, -1, i) if t["changed"] is None else (1, t["changed"], i)
        if k == "f":
            return (0, -1.0, i) if t["changed_fraction"] is None else (1, t["changed_fraction"], i)
        if k == "b":
            return (0, t["bytes"], i)
        return (0, -1.0, i) if not t["changed"] else (1, t["bytes"] / t["changed"], i)
    out = {}
    for k, _ in _SORTS:
        order = sorted(rows, key=lambda i: val(tensors[i], k, i))
        out[k] = {i: r for r, i in enumerate(order)}
    return out


def _table(styles: _Styles, fig: dict, cap: int) -> tuple[str, list]:
    """The table of the ``cap`` largest tensors (all, when there are no more), in file order, sortable
    without script: a radio per order, CSS ``order`` from each row's ranks (see CSS)."""
    tensors = fig["tensors"]
    keep = sorted(sorted(range(len(tensors)), key=lambda i: (-tensors[i]["bytes"], i))[:cap])
    with_base = fig["base"] is not None
    ranks = _ranks(tensors, keep)

    def th(col: str, key: str | None = None) -> str:
        if key is None:
            return f'<th scope="col"><span class="h">{_e(col)}</span></th>'
        first = "a" if key in ("i", "n") else "d"
        second = "d" if first == "a" else "a"
        arrows = {"a": "▲", "d": "▼"}
        links = "".join(f'<label class="sorter" for="sort-{key}-{d}" title="sort by {_e(col)}, '
                        f'{"ascending" if d == "a" else "descending"}">{arrows[d]}</label>' for d in (first, second))
        return f'<th scope="col"><span class="h">{_e(col)}</span><span class="sorters">{links}</span></th>'

    cols = [th("#", "i"), th("tensor", "n"), th("dtype · shape"), th("elements", "e"), th("changed", "c"),
            th("changed %", "f"), th("bytes · % of file", "b"), th("bits / changed", "p"), th("encodings"),
            th("streams: role codec stored (empty ones left out)")] + ([th("base")] if with_base else [])
    file_bytes = max(fig["file_bytes"], 1)
    rows = []
    for i in keep:
        t = tensors[i]
        chips = "".join(
            f'<span class="chip">{_swatch(styles, _series_style(ROLE_STYLES, r["role"]))}{_e(r["role"])} '
            f'{_e(r["codec"])} {_e(fmt_bytes(r["stored"]))}</span>' for r in t["streams"] if r["stored"]) or "—"
        per_changed = f'{8 * t["bytes"] / t["changed"]:.1f}' if t["changed"] else "—"
        changed = "?" if t["changed"] is None else fmt_int(t["changed"])
        var = ";".join(f"--{k}:{ranks[k][i]}" for k, _ in _SORTS)
        cells = [
            f'<td class="num">{i}</td>',
            f'<td class="name">{_name(t["name"])}</td>',
            f'<td>{_e(t["dtype"])} · {_e(_shape(t["shape"]))}</td>',
            f'<td class="num" data-value="{t["elements"]}">{fmt_int(t["elements"])}</td>',
            f'<td class="num" data-value="{"" if t["changed"] is None else t["changed"]}">{changed}</td>',
            f'<td class="num">{_e(fmt_pct(t["changed_fraction"]))}</td>',
            f'<td class="num" data-value="{t["bytes"]}">{_e(fmt_bytes(t["bytes"]))} · '
            f'{_e(fmt_pct(t["bytes"] / file_bytes))}</td>',
            f'<td class="num">{_e(per_changed)}</td>',
            f'<td class="encs">{_e(", ".join(t["encodings"]) or "—")}</td>',
            f'<td class="streams">{chips}</td>',
        ]
        if with_base:
            st = t["base_status"]
            cls = "status-ok" if st in ("ok", "present") else "status-bad"
            cells.append(f'<td class="{cls}">{_e(st)}</td>')
        rows.append(f'<tr data-name="{_e(t["name"])}" style="{var}">{"".join(cells)}</tr>')
    radios = "".join(f'<input type="radio" class="sort" name="sort" id="sort-{k}-{d}"'
                     f'{" checked" if (k, d) == ("i", "a") else ""}>' for k, _ in _SORTS for d in ("a", "d"))
    table = (f'{radios}<p class="note sortnote">Sort with the ▲ ▼ in the column heads (no script needed).</p>'
             f'<div class="tablewrap"><table id="tensor-table"><thead><tr>{"".join(cols)}</tr></thead>'
             f'<tbody>{"".join(rows)}</tbody></table></div>')
    return table, keep


def _sort_css() -> str:
    rules = []
    for k, _ in _SORTS:
        rules.append(f"#sort-{k}-a:checked~.tablewrap tbody tr{{order:var(--{k})}}"
                     f"#sort-{k}-d:checked~.tablewrap tbody tr{{order:calc(-1*var(--{k}))}}")
        rules.append(f"#sort-{k}-a:checked~.tablewrap label[for=sort-{k}-a],"
                     f"#sort-{k}-d:checked~.tablewrap label[for=sort-{k}-d]{{color:#fff;background:var(--accent)}}")
    # rows re-ordered by CSS need one grid for the whole table (subgrid keeps the columns aligned);
    # where subgrid is missing the table stays a plain table in file order and the arrows are hidden
    return ("@supports (grid-template-columns:subgrid){"
            "#tensor-table{display:grid;grid-template-columns:max-content minmax(26ch,46ch) repeat(7,max-content) "
            "minmax(300px,1fr) max-content}"
            "#tensor-table thead,#tensor-table tbody{display:contents}"
            "#tensor-table tr{display:grid;grid-column:1/-1;grid-template-columns:subgrid}"
            "#tensor-table thead tr{position:sticky;top:0;z-index:2;order:-2147483647}"
            ".sorters{display:block}.sortnote{display:block}"
            "#tensor-table tbody tr{background:none}"  # zebra stripes would follow the file order
            + "".join(rules) + "}")


# ------------------------------------------------------------------------------------ page

CSS = """
:root{--fg:#1d2330;--muted:#5b6475;--line:#e4e7ec;--bg:#fff;--card:#f7f8fa;--zebra:#f5f6f8;--accent:#0072B2;
--bad:#D55E00;--good:#009E73}
@media (prefers-color-scheme:dark){:root{--fg:#e6e8ee;--muted:#a3acbb;--line:#303644;--bg:#14171d;--card:#1c2028;
--zebra:#1a1e25;--accent:#56B4E9}}
*{box-sizing:border-box;-webkit-print-color-adjust:exact;print-color-adjust:exact}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:1480px;margin:0 auto;padding:28px 24px 60px}
h1{font-size:24px;margin:0 0 4px}
h2{font-size:17px;margin:36px 0 6px}
p.sub,p.hint{color:var(--muted);margin:0 0 12px}
.badge{display:inline-block;font-size:12px;padding:1px 8px;border-radius:10px;background:var(--accent);color:#fff;
vertical-align:3px;margin-left:6px}
.badge.kf{background:#D55E00}.badge.empty{background:#666}
.alert{border:2px solid var(--bad);border-radius:10px;padding:10px 14px;margin:14px 0;font-weight:600}
.alert small{display:block;font-weight:400;overflow-wrap:anywhere}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(180px,1fr));gap:12px;margin:18px 0}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 14px}
.card .k{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:22px;font-weight:650;margin-top:2px;font-variant-numeric:tabular-nums}
.card .s{font-size:12px;color:var(--muted)}
.card.bad{border:2px solid var(--bad)}.card.good{border:2px solid var(--good)}
.card.bad .v::before{content:"✗ ";color:var(--bad)}.card.good .v::before{content:"✓ ";color:var(--good)}
dl.ids{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0;font-size:13px}
dl.ids dt{color:var(--muted)}
dl.ids dd{margin:0;font-family:ui-monospace,SFMono-Regular,Menlo,monospace;overflow-wrap:anywhere}
.stack{margin:10px 0 18px}.stacklabel{font-weight:600;margin-bottom:4px}
.whole{display:flex;height:26px;border-radius:4px;overflow:hidden;background:var(--zebra);max-width:1100px}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;font-size:12.5px;margin-top:5px}
.sw{display:inline-block;width:14px;height:12px;border-radius:2px;margin-right:5px;vertical-align:-1px;
outline:1px solid rgba(0,0,0,.25)}
.key b{font-weight:600;margin-left:4px;font-variant-numeric:tabular-nums}.key small{color:var(--muted);margin-left:4px}
i.seg{display:block;height:100%;flex:none;min-width:1px;overflow:hidden;font-style:normal;position:relative}
i.seg+i.seg{box-shadow:inset 1px 0 0 var(--bg)}
i.seg b{position:absolute;left:3px;top:50%;transform:translateY(-50%);font:600 11px/1.3 system-ui,sans-serif;
color:#111;background:rgba(255,255,255,.88);border-radius:3px;padding:0 4px;white-space:nowrap;
max-width:calc(100% - 6px);overflow:hidden;text-overflow:clip}
.unknown{background:repeating-linear-gradient(135deg,#ddd 0 4px,#999 4px 6px)}
.bars{display:grid;gap:0 12px;align-items:center;font-size:12.5px;font-variant-numeric:tabular-nums;
border:1px solid var(--line);border-radius:10px;padding:6px 10px;overflow-x:auto}
.bars.five{grid-template-columns:minmax(14ch,max-content) minmax(180px,1fr) max-content minmax(90px,.45fr) max-content}
.bars.six{grid-template-columns:minmax(14ch,max-content) minmax(160px,1fr) max-content minmax(80px,.4fr)
max-content max-content}
.bars.four{grid-template-columns:minmax(12ch,max-content) minmax(200px,1fr) max-content max-content}
.bars .row{display:contents}
.bars .row>span{padding:3px 0;border-bottom:1px solid var(--line);min-height:22px}
.bars .row.head>span{font-weight:600;color:var(--muted);font-size:12px}
.bars .row.other .nm{font-style:italic}
.nm{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;overflow-wrap:anywhere;max-width:52ch}
.nm small{color:var(--muted);font-family:system-ui,sans-serif;margin-left:4px;white-space:nowrap}
.val{white-space:nowrap;text-align:right}.val.codecs{text-align:left;color:var(--muted)}
.bars.four .row>span:last-child{text-align:left}
.track{display:flex;align-items:center;height:22px}
.stk{display:flex;height:13px;border-radius:2px;overflow:hidden;min-width:1px}
.stk.unknown{height:13px}.stk[style="width:0%"]{display:none}
.note{color:var(--muted);font-size:12.5px;margin:6px 0}
table{border-collapse:collapse;font-size:12.5px;font-variant-numeric:tabular-nums}
.tablewrap{max-height:85vh;overflow:auto;border:1px solid var(--line);border-radius:10px}
th,td{padding:4px 6px;border-bottom:1px solid var(--line);text-align:left;white-space:nowrap}
th{position:sticky;top:0;background:var(--card);font-weight:600;z-index:1;vertical-align:bottom;white-space:normal}
th .h{display:block;max-width:12ch}th:nth-child(2) .h,th:nth-child(10) .h{max-width:none}
tbody tr:nth-child(even){background:var(--zebra)}
td.num{text-align:right}
td.streams{white-space:normal;min-width:300px}
td.encs{white-space:normal;max-width:12ch}
td.name{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;white-space:normal;overflow-wrap:anywhere;
min-width:26ch;max-width:46ch;font-size:12px}
thead tr{background:var(--card)}
.chip{display:inline-block;margin:0 8px 0 0;white-space:nowrap;font-size:11.5px}
.chip .sw{width:10px;height:10px;margin-right:3px}
input.sort{position:absolute;opacity:0;pointer-events:none;width:1px;height:1px}
.sorters,.sortnote{display:none}
label.sorter{cursor:pointer;color:var(--muted);font-size:10px;padding:0 3px;margin-left:2px;border-radius:3px;
border:1px solid var(--line)}
label.sorter:hover{color:var(--fg);border-color:var(--muted)}
.status-ok{color:var(--good)}.status-bad{color:var(--bad);font-weight:600}
.status-bad::before{content:"✗ "}
footer{margin-top:40px;color:var(--muted);font-size:12px}
"""


def _card(key: str, value: str, sub: str = "", cls: str = "") -> str:
    return (f'<div class="card {cls}"><div class="k">{_e(key)}</div><div class="v">{_e(value)}</div>'
            f'<div class="s">{_e(sub)}</div></div>')


def _steps(fig) -> str:
    b, t = fig["base_step"], fig["target_step"]
    if fig["kind"] == "keyframe":
        return "keyframe" if t is None else f"→ {t}"
    return f"{'?' if b is None else b} → {'?' if t is None else t}"


def _cost_card(fig) -> str:
    if fig["kind"] == "delta" and fig["changed"]:
        return _card("bits per changed value", f"{8 * fig['file_bytes'] / fig['changed']:.2f}",
                     "the whole file ÷ the values it changes")
    if fig["elements"]:
        return _card("bits per value", f"{8 * fig['file_bytes'] / fig['elements']:.3f}",
                     "the whole file ÷ the model's values")
    return _card("bits per value", "—", "no values")


def base_problems(fig: dict) -> list[tuple[str, list]]:
    """(kind, names) of what is wrong with the base the figures were checked against (empty: fine)."""
    b = fig.get("base")
    if not b:
        return []
    return [(k, b[k]) for k in ("differs", "missing", "mismatch") if b[k]]


def _base_card(fig) -> str:
    b = fig["base"]
    if b is None:
        if fig["kind"] == "delta":
            return _card("base", "not checked", "give --base to check it against the file")
        return _card("base", "not needed", "a keyframe rebuilds without a base" if fig["kind"] == "keyframe" else "")
    bad = base_problems(fig)
    if bad:
        n = sum(len(v) for _, v in bad)
        return _card("base", "wrong", f"{n} of {fig['tensor_count']} tensors do not match: "
                     + ", ".join(f"{len(v)} {k}" for k, v in bad), "bad")
    if b["ok"]:
        return _card("base", "matches", f"{b['ok']} tensors checked by hash", "good")
    return _card("base", "compared", f"{b['present']} keyframe tensors compared value by value", "good")


def _base_alert(fig) -> str:
    bad = base_problems(fig)
    if not bad:
        return ""
    n = sum(len(v) for _, v in bad)
    what = {"differs": "differ from the base the delta was made from",
            "missing": "are missing from it", "mismatch": "have another shape or dtype"}
    detail = "; ".join(f"{len(v)} {what[k]}: " + ", ".join(v[:5]) + (f" and {len(v) - 5} more" if len(v) > 5 else "")
                       for k, v in bad)
    where = f" ({fig['base']['path']})" if fig["base"].get("path") else ""
    return (f'<div class="alert" role="alert">Wrong base{_e(where)}: {n} of {fig["tensor_count"]} tensors do not '
            f'match; this delta does not apply to it.<small>{_e(detail)}</small></div>')


def _page(fig: dict, bars: int, rows: int, groups: int) -> str:
    styles = _Styles()
    n = fig["tensor_count"]
    title = f"arcfmt {fig['kind']} · {_steps(fig)}"
    badge_cls = {"keyframe": "kf", "empty": "empty"}.get(fig["kind"], "")
    ratio = fig["ratio_percent"]
    cards = [
        _card("file size", fmt_bytes(fig["file_bytes"]),
              f"{fmt_pct(ratio / 100)} of the model's {fmt_bytes(fig['model_bytes'])}" if ratio is not None
              else "no tensor bytes in this file"),
        _card("steps", _steps(fig), f"format version {fig['format_version']}"),
        _card("tensors", fmt_int(n), f"{fmt_int(fig['block_count'])} blocks · {fmt_int(fig['elements'])} values"),
        _card("changed values",
              fmt_pct(fig["changed_fraction"]) if fig["changed"] is not None and fig["elements"] else
              ("0" if fig["changed"] is not None else "unknown"),
              f"{fmt_int(fig['changed'])} of {fmt_int(fig['elements'])}" if fig["changed"] is not None else
              f"known for {fmt_int(fig['changed_known_elements'])} of {fmt_int(fig['elements'])} values"
              " (give --base to count keyframes)"),
        _cost_card(fig),
        _base_card(fig),
    ]
    ids = (f'<dl class="ids"><dt>base digest</dt><dd>{_e(fig["base_digest"])}</dd>'
           f'<dt>target digest</dt><dd>{_e(fig["target_digest"])}</dd>'
           f'<dt>index</dt><dd>{_e(fmt_bytes(fig["index_bytes"]))}</dd>'
           + (f'<dt>base</dt><dd>{_e(fig["base"]["path"])}</dd>' if fig["base"] and fig["base"]["path"] else "")
           + "</dl>")
    roles = [(k, v, _series_style(ROLE_STYLES, k)) for k, v in fig["bytes_by_role"].items()]
    codecs = [(k, v, _series_style(CODEC_STYLES, k)) for k, v in fig["bytes_by_codec"].items()]
    encs = [(k, fig["elements_by_encoding"][k], _series_style(ENCODING_STYLES, k))
            for k in sorted(fig["elements_by_encoding"], key=lambda k: -fig["elements_by_encoding"][k])]
    summary = (_stacked(styles, "summary-roles", roles, "file bytes by stream role", fmt_bytes)
               + _stacked(styles, "summary-codecs", codecs, "stream bytes by codec", fmt_bytes)
               + _stacked(styles, "summary-encodings", encs, "values by block encoding",
                          lambda v: f"{fmt_int(v)} values"))
    used = ", ".join(f"{k} ({fmt_int(fig['blocks_by_encoding'][k])} blocks)" for k in fig["blocks_by_encoding"])

    body = [f'<header><h1>{_e(title)}<span class="badge {badge_cls}">{_e(fig["kind"])}</span></h1>'
            f'<p class="sub">arcfmt {_e(fig["format_version"])} · {_e(fmt_bytes(fig["file_bytes"]))} · '
            f'{fmt_int(n)} tensors · encodings used: {_e(used) or "none"}</p>{_base_alert(fig)}'
            f'<div class="cards">{"".join(cards)}</div>{ids}</header>',
            f'<section id="summary"><h2>Where the bytes go</h2>{summary}</section>']
    if n:
        role_keys = [k for k, v in fig["bytes_by_role"].items() if k != FILE_OVERHEAD and v > 0]
        shown = min(bars, n)
        enc_keys = sorted(fig["blocks_by_encoding"], key=lambda k: -fig["elements_by_encoding"][k])
        enc_keys += ["mixed"] if any(len(t["encodings"]) > 1 for t in fig["tensors"]) else []
        body.append(
            f'<section id="largest"><h2>{"All tensors" if shown == n else f"The {shown} largest tensors"}, '
            f'largest first</h2>'
            f'<p class="hint">Stored bytes of each stream role (SPEC.md §8) and of the record headers, and the '
            f'share of values changed, coloured by block encoding; point at a segment for its codec and size.'
            f'{"" if shown == n else f" {n - shown} smaller tensors are in the groups and the table below."}</p>'
            f'{_legend(styles, role_keys, ROLE_STYLES, "bytes:")}'
            f'{_legend(styles, enc_keys, ENCODING_STYLES, "changed, by encoding:")}'
            f'{_largest_chart(styles, fig, bars)}</section>')
        gchart, gleft = _groups_chart(styles, fig, groups)
        body.append(
            '<section id="groups"><h2>By tensor group</h2>'
            '<p class="hint">Tensors whose names differ only in their numbers (layers, experts) summed, '
            'largest first' + (f'; the {gleft} smallest groups are summed in the last row' if gleft else '') +
            f'. Every tensor is in one row.</p>{gchart}</section>')
        body.append(
            '<section id="codecs"><h2>Codec chosen per stream</h2>'
            '<p class="hint">The smallest of raw, zstd, xz and bz2 is kept for each stream of each block; '
            'the bytes of each stream role, by the codec its blocks chose.</p>'
            f'{_legend(styles, [k for k in CODEC_STYLES if k in fig["bytes_by_codec"]], CODEC_STYLES)}'
            f'{_codec_chart(styles, fig)}</section>')
        body.append(
            f'<section id="blocks"><h2>Blocks by changed values</h2><p class="hint">All '
            f'{fmt_int(fig["block_count"])} blocks, by the share of their values that changed: the per-block '
            'detail of this file, aggregated (per tensor in the table; <code>arcfmt inspect --blocks</code> '
            f'lists every block).</p>{_histogram(styles, fig)}</section>')
        table, keep = _table(styles, fig, rows)
        if len(keep) < n:
            kept = set(keep)
            left = [t for i, t in enumerate(fig["tensors"]) if i not in kept]
            capped = (f'<p class="note">This table lists the {fmt_int(len(keep))} largest of {fmt_int(n)} tensors '
                      f'(by bytes), in file order; the other {fmt_int(len(left))} '
                      f'({fmt_bytes(sum(t["bytes"] for t in left))}) are counted in the totals, the groups and '
                      'the block histogram above, so that this page stays under 1 MiB. '
                      '<code>arcfmt report --json</code> and <code>arcfmt inspect</code> list them all.</p>')
        else:
            capped = ""
        body.append(f'<section id="table"><h2>Every tensor</h2>{capped}{table}</section>')
    else:
        body.append('<section id="table"><h2>Every tensor</h2><p class="note">This file holds no tensors.</p>'
                    '</section>')
    body.append(f'<footer>arcfmt {_e(__version__)} report · stream roles as in SPEC.md §8 · colours: Okabe–Ito, '
                'each series also patterned · one self-contained page, no scripts</footer>')
    css = CSS + _sort_css() + styles.css()
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{_e(title)}</title><style>{css}</style></head><body><main>'
            + "".join(body) + "</main></body></html>\n")


MAX_PAGE_BYTES = 1 << 20


def render_html(fig: dict, *, max_bars: int = 30, max_rows: int = 3000, max_groups: int = 60,
                max_bytes: int = MAX_PAGE_BYTES) -> str:
    """The page for figures from :func:`report_figures`: the ``max_bars`` largest tensors drawn, the
    groups (``max_groups`` largest, the rest summed in one row), codecs per role, a histogram of the
    blocks, and a table of at most ``max_rows`` tensors (the largest); fewer, when that is what keeps
    the page within ``max_bytes`` (UTF-8) — what is left out is said on the page and summed in the
    totals, groups and histogram."""
    n = fig["tensor_count"]
    rows, groups, bars = min(max_rows, n), max_groups, max_bars
    while True:
        page = _page(fig, bars, rows, groups)
        size = len(page.encode("utf-8"))
        if size <= max_bytes or (rows == 0 and groups == 0 and bars == 0):
            return page
        if rows > 0:
            rows = max(0, min(rows - 1, int(rows * max_bytes / size * 0.95)))
        else:
            groups, bars = groups // 2, bars // 2


def render_report(delta_path_or_bytes, base=None, **caps) -> str:
    """One self-contained HTML page describing a delta (see the module docstring).

    ``delta_path_or_bytes``: a path, bytes, a binary file object or a DeltaReader; ``base``: optional,
    name → array or a checkpoint path (checks the base and counts changes in keyframe blocks);
    ``caps``: those of :func:`render_html`.
    """
    return render_html(report_figures(delta_path_or_bytes, base), **caps)
