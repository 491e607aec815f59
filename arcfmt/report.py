"""A picture of a delta: one self-contained HTML page (inline SVG charts, no script, no external resource).

``report_figures`` gathers the numbers (everything ``DeltaReader.describe`` gives, grouped by the stream
roles of SPEC.md §8 as the encoding registry names them, plus totals); ``render_html`` draws them;
``render_report`` does both. The page has a header (identity, size, share of the model), where the
bytes go (by stream role, by codec, elements by encoding), a bar per tensor of bytes split by stream
role, a bar per tensor of the changed fraction, the codec chosen for every stream, and a table with the
same numbers.

Everything taken from the file (tensor names above all) is untrusted and is escaped before it is
written into the page.
"""
from __future__ import annotations

import functools
import html
import math
import os
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

ROLE_COLORS = {
    "positions": "#4e79a7", "steps": "#59a14f", "exceptions": "#f28e2b", "values": "#e15759",
    "exponent": "#76b7b2", "sign+mantissa": "#edc948", "elements": "#9c755f",
    "quotients": "#2f5d8a", "remainders": "#8cb3d9", "signs": "#b07aa1", "magnitudes": "#59a14f",
    HEADERS: "#bab0ac", FILE_OVERHEAD: "#7f7f7f",
}
_XOR_SHADES = ["#4b2a6b", "#6a3d8f", "#8751ad", "#a06cc4", "#b78ad5", "#cba8e2", "#dcc5ec", "#ebdef4"]
ROLE_COLORS.update((f"xor plane {k}", c) for k, c in enumerate(_XOR_SHADES))

CODEC_COLORS = {"raw": "#c7c7c7", "zstd": "#3f6fa8", "xz": "#d9822b", "bz2": "#3f9a5a", "mixed": "#a05fa8"}
ENCODING_COLORS = {"unchanged": "#d5d5d5", "xor": "#8751ad", "bf16-delta": "#4e79a7",
                   "float-delta": "#76b7b2", "keyframe": "#e15759", "ctx-delta": "#2f5d8a"}
_FALLBACK = "#999999"


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

        return open_checkpoint(os.fspath(base)).tensors(), os.fspath(base)
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


def _short(name: str, limit: int = 46) -> str:
    """A long tensor name cut in the middle (the end of a name is what tells layers apart)."""
    if len(name) <= limit:
        return name
    head = (limit - 1) * 2 // 5
    return name[:head] + "…" + name[len(name) - (limit - 1 - head):]


def _shape(shape) -> str:
    return "×".join(map(str, shape)) if shape else "scalar"


def _nice_step(x: float) -> float:
    """The smallest 1-2-2.5-5 number ≥ x (x > 0)."""
    exp = 10.0 ** math.floor(math.log10(x))
    for m in (1, 2, 2.5, 5, 10):
        if m * exp >= x * (1 - 1e-9):
            return m * exp
    return 10 * exp  # pragma: no cover


def _ticks(vmax: float, unit: float = 1.0, target: int = 4) -> list:
    """Axis ticks from 0 covering ``vmax``, round in ``unit`` (e.g. KiB), about ``target`` intervals."""
    if vmax <= 0:
        return [0.0, unit]
    step = _nice_step(vmax / unit / target)
    n = max(1, math.ceil(vmax / unit / step - 1e-9))
    return [k * step * unit for k in range(n + 1)]


def _tick_bytes(v: float) -> str:
    unit = _byte_unit(v)
    names = dict(zip((1, 1024, 1024 ** 2, 1024 ** 3, 1024 ** 4), ("B", "KiB", "MiB", "GiB", "TiB")))
    return f"{v / unit:.4g} {names[int(unit)]}"


def _tick_pct(v: float) -> str:
    return f"{100 * v:.4g} %"


def _byte_unit(n: float) -> float:
    unit = 1.0
    while n >= 1024 * unit and unit < 1024 ** 4:
        unit *= 1024
    return unit


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


# ------------------------------------------------------------------------------------ charts

ROW, BAR, LABEL_W = 18, 12, 300
SVG_NS = 'xmlns="http://www.w3.org/2000/svg"'


def _pick(tensors: list, cap: int) -> tuple[list, int]:
    """(indexes to draw, in file order; how many were left out): the ``cap`` largest by bytes."""
    idx = list(range(len(tensors)))
    if len(idx) <= cap:
        return idx, 0
    keep = sorted(sorted(idx, key=lambda i: -tensors[i]["bytes"])[:cap])
    return keep, len(idx) - cap


def _axis(x0: float, width: float, top: float, height: float, ticks: list, label) -> str:
    parts = []
    for v in ticks:
        x = x0 + width * v / ticks[-1]
        parts.append(f'<line class="grid" x1="{_num(x)}" y1="{_num(top - 4)}" x2="{_num(x)}" '
                     f'y2="{_num(top + height)}"/>')
        parts.append(f'<text class="tick" x="{_num(x)}" y="{_num(top - 8)}" text-anchor="middle">'
                     f'{_e(label(v))}</text>')
    return "".join(parts)


def _label_width(tensors: list, keep: list) -> int:
    """Room for the longest (shortened) name, 11 px monospace: 6.7 px a character."""
    longest = max((len(_short(tensors[i]["name"])) for i in keep), default=8)
    return int(min(LABEL_W, max(90, 6.7 * longest + 16)))


def _svg_open(svg_id: str, width: float, height: float, label: str) -> str:
    return (f'<svg {SVG_NS} id="{svg_id}" class="chart" width="{_num(width)}" height="{_num(height)}" '
            f'viewBox="0 0 {_num(width)} {_num(height)}" role="img" aria-label="{_e(label)}">')


def bytes_chart(fig: dict, cap: int) -> tuple[str, int]:
    tensors = fig["tensors"]
    keep, left = _pick(tensors, cap)
    lw = _label_width(tensors, keep)
    bar_w, val_w, top = 560, 150, 28
    width = lw + bar_w + val_w
    height = top + ROW * len(keep) + 6
    biggest = max((tensors[i]["bytes"] for i in keep), default=1)
    ticks = _ticks(biggest, _byte_unit(biggest))
    vmax = ticks[-1]
    out = [_svg_open("bytes-chart", width, height, "bytes per tensor by stream role"),
           _axis(lw, bar_w, top, ROW * len(keep), ticks, _tick_bytes)]
    file_bytes = max(fig["file_bytes"], 1)
    for row, i in enumerate(keep):
        t = tensors[i]
        y = top + row * ROW
        segs = [(r["role"], r["stored"], r["codec"], r["decoded"]) for r in t["streams"] if r["stored"]]
        segs.append((HEADERS, t["header_bytes"], "", None))
        detail = ", ".join(f"{role} {fmt_bytes(st)}" + (f" ({c})" if c else "") for role, st, c, _ in segs)
        out.append(f'<g class="bar" data-index="{i}" data-name="{_e(t["name"])}" data-bytes="{t["bytes"]}" '
                   f'transform="translate(0,{y})">')
        out.append(f'<title>{_e(t["name"])} — {_e(fmt_bytes(t["bytes"]))}: {_e(detail)}</title>')
        if row % 2:
            out.append(f'<rect class="zebra" x="0" y="0" width="{width}" height="{ROW}"/>')
        out.append(f'<text class="lbl" x="{lw - 8}" y="13" text-anchor="end">{_e(_short(t["name"]))}</text>')
        x = float(lw)
        for role, st, codec, decoded in segs:
            w = bar_w * st / vmax
            tip = f"{role}: {fmt_bytes(st)} stored" + (f", {codec}, from {fmt_bytes(decoded)}" if codec else "")
            out.append(f'<rect class="seg" x="{_num(x)}" y="{(ROW - BAR) // 2}" width="{_num(w)}" height="{BAR}" '
                       f'fill="{ROLE_COLORS.get(role, _FALLBACK)}" data-role="{_e(role)}" data-stored="{st}" '
                       f'data-codec="{_e(codec)}"><title>{_e(tip)}</title></rect>')
            x += w
        out.append(f'<text class="val" x="{_num(x + 6)}" y="13">{_e(fmt_bytes(t["bytes"]))} · '
                   f'{_e(fmt_pct(t["bytes"] / file_bytes))}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out), left


def changed_chart(fig: dict, cap: int) -> tuple[str, int]:
    tensors = fig["tensors"]
    keep, left = _pick(tensors, cap)
    lw = _label_width(tensors, keep)
    bar_w, val_w, top = 560, 230, 28
    width = lw + bar_w + val_w
    height = top + ROW * len(keep) + 6
    fmax = max((tensors[i]["changed_fraction"] or 0 for i in keep), default=0)
    ticks = [t for t in _ticks(fmax if fmax > 0 else 0.01) if t <= 1 + 1e-12]
    vmax = ticks[-1]
    out = [_svg_open("changed-chart", width, height, "changed fraction per tensor"),
           '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><rect width="6" height="6" fill="#eeeeee"/>'
           '<line x1="0" y1="0" x2="0" y2="6" stroke="#c4c4c4" stroke-width="3"/></pattern></defs>',
           _axis(lw, bar_w, top, ROW * len(keep), ticks, _tick_pct)]
    for row, i in enumerate(keep):
        t = tensors[i]
        y = top + row * ROW
        frac = t["changed_fraction"]
        # coloured by the tensor's encoding, or "mixed" when its blocks use several
        main = (t["encodings"][0] if len(t["encodings"]) == 1 else "mixed") if t["encodings"] else None
        attrs = (f'data-index="{i}" data-name="{_e(t["name"])}" data-elements="{t["elements"]}" '
                 f'data-changed="{"" if t["changed"] is None else t["changed"]}"')
        out.append(f'<g class="bar" {attrs} transform="translate(0,{y})">')
        if t["elements"] == 0:
            value, tip = "empty tensor", "no elements"
        elif frac is None:
            value = "unknown: keyframe (give --base to count)"
            tip = value
        else:
            value = f"{fmt_pct(frac)} · {fmt_int(t['changed'])} of {fmt_int(t['elements'])}"
            tip = f"{value} (counted from {t['changed_source']})"
        out.append(f'<title>{_e(t["name"])} — {_e(tip)}</title>')
        if row % 2:
            out.append(f'<rect class="zebra" x="0" y="0" width="{width}" height="{ROW}"/>')
        out.append(f'<text class="lbl" x="{lw - 8}" y="13" text-anchor="end">{_e(_short(t["name"]))}</text>')
        x_end = lw
        if t["elements"] and frac is None:
            out.append(f'<rect class="unknown" x="{lw}" y="{(ROW - BAR) // 2}" width="{bar_w}" '
                       f'height="{BAR}" fill="url(#hatch)"/>')
            x_end = lw + bar_w
        elif frac is not None:
            w = bar_w * min(frac, vmax) / vmax
            color = ENCODING_COLORS.get(main, CODEC_COLORS["mixed"]) if main else _FALLBACK
            out.append(f'<rect class="fill" x="{lw}" y="{(ROW - BAR) // 2}" width="{_num(w)}" height="{BAR}" '
                       f'fill="{color}" data-fraction="{frac!r}"/>')
            x_end = lw + w
        out.append(f'<text class="val" x="{_num(x_end + 6)}" y="13">{_e(value)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out), left


def codec_chart(fig: dict, cap: int) -> tuple[str, int]:
    tensors = fig["tensors"]
    keep, left = _pick(tensors, cap)
    roles = sorted({r["role"] for i in keep for r in tensors[i]["streams"]}, key=_role_key)
    lw = _label_width(tensors, keep)
    col, top = 86, 30
    width = lw + max(len(roles), 2) * col + 10
    height = top + ROW * len(keep) + 6
    out = [_svg_open("codec-chart", width, height, "codec chosen per stream")]
    for k, role in enumerate(roles):
        out.append(f'<text class="colhead" x="{lw + k * col + col / 2}" y="{top - 10}" '
                   f'text-anchor="middle">{_e(role)}</text>')
    for row, i in enumerate(keep):
        t = tensors[i]
        y = top + row * ROW
        by_role = {r["role"]: r for r in t["streams"]}
        out.append(f'<g class="bar" data-index="{i}" data-name="{_e(t["name"])}" transform="translate(0,{y})">')
        if row % 2:
            out.append(f'<rect class="zebra" x="0" y="0" width="{width}" height="{ROW}"/>')
        out.append(f'<text class="lbl" x="{lw - 8}" y="13" text-anchor="end">{_e(_short(t["name"]))}</text>')
        if not by_role:
            why = "empty tensor" if t["elements"] == 0 else "no streams (unchanged)"
            out.append(f'<text class="note" x="{lw + 4}" y="13">{why}</text>')
        for k, role in enumerate(roles):
            r = by_role.get(role)
            if r is None:
                continue
            codec = r["codec"]
            color = CODEC_COLORS.get(codec, _FALLBACK)
            ratio = f", {fmt_pct(r['stored'] / r['decoded'])} of {fmt_bytes(r['decoded'])}" if r["decoded"] else ""
            tip = f"{t['name']} · {role}: {codec} " + (
                "(" + ", ".join(f"{c} {fmt_bytes(s)}" for c, s in r["codecs"].items()) + ")" if codec == "mixed"
                else "") + f" {fmt_bytes(r['stored'])} stored{ratio}"
            x = lw + k * col
            fg = "#222" if codec in ("raw",) else "#fff"
            out.append(f'<rect class="cell" x="{x + 2}" y="2" width="{col - 4}" height="{ROW - 4}" rx="3" '
                       f'fill="{color}" data-role="{_e(role)}" data-codec="{_e(codec)}" data-stored="{r["stored"]}">'
                       f'<title>{_e(tip)}</title></rect>')
            out.append(f'<text class="cellt" x="{x + col / 2}" y="13" text-anchor="middle" fill="{fg}">'
                       f'{_e(codec)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out), left


def _stacked(svg_id: str, items: list, label: str, fmt) -> str:
    """A 100 % bar of (key, value, colour) items, with an HTML legend below it."""
    total = sum(v for _, v, _ in items)
    width, height = 900, 26
    out = [_svg_open(svg_id, width, height, label)]
    x = 0.0
    for key, v, color in items:
        if v <= 0 or total <= 0:
            continue
        w = width * v / total
        out.append(f'<rect class="part" x="{_num(x)}" y="2" width="{_num(w)}" height="{height - 4}" '
                   f'fill="{color}" data-key="{_e(key)}" data-value="{v}"><title>{_e(key)}: {_e(fmt(v))} '
                   f'({_e(fmt_pct(v / total))})</title></rect>')
        x += w
    if total <= 0:
        out.append('<text class="note" x="4" y="17">nothing</text>')
    out.append("</svg>")
    legend = "".join(
        f'<span class="key"><i style="background:{color}"></i>{_e(key)} <b>{_e(fmt(v))}</b>'
        f'<small>{_e(fmt_pct(v / total)) if total else ""}</small></span>'
        for key, v, color in items if v > 0)
    return (f'<div class="stack"><div class="stacklabel">{_e(label)}</div>{"".join(out)}'
            f'<div class="legend">{legend}</div></div>')


# ------------------------------------------------------------------------------------ page

CSS = """
:root{--fg:#1d2330;--muted:#667085;--line:#e4e7ec;--bg:#fff;--card:#f7f8fa;--zebra:#f5f6f8;--accent:#3f6fa8}
@media (prefers-color-scheme:dark){:root{--fg:#e6e8ee;--muted:#9aa3b2;--line:#303644;--bg:#14171d;--card:#1c2028;
--zebra:#1a1e25;--accent:#8fb3e6}}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:1240px;margin:0 auto;padding:28px 24px 60px}
h1{font-size:24px;margin:0 0 4px}
h2{font-size:17px;margin:36px 0 6px}
p.sub,p.hint{color:var(--muted);margin:0 0 12px}
.badge{display:inline-block;font-size:12px;padding:1px 8px;border-radius:10px;background:var(--accent);color:#fff;
vertical-align:3px;margin-left:6px}
.badge.kf{background:#e15759}.badge.empty{background:#7f7f7f}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(180px,1fr));gap:12px;margin:18px 0}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 14px}
.card .k{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:22px;font-weight:650;margin-top:2px;font-variant-numeric:tabular-nums}
.card .s{font-size:12px;color:var(--muted)}
.card.bad{border-color:#e15759}.card.good{border-color:#59a14f}
dl.ids{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0;font-size:13px}
dl.ids dt{color:var(--muted)}
dl.ids dd{margin:0;font-family:ui-monospace,SFMono-Regular,Menlo,monospace;overflow-wrap:anywhere}
.stack{margin:10px 0 16px}.stacklabel{font-weight:600;margin-bottom:4px}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;font-size:12.5px;margin-top:4px}
.key i{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.key b{font-weight:600;margin-left:4px;font-variant-numeric:tabular-nums}.key small{color:var(--muted);margin-left:4px}
.scroll{max-height:72vh;overflow:auto;border:1px solid var(--line);border-radius:10px;padding:4px 0}
svg.chart{display:block;font:11px ui-monospace,SFMono-Regular,Menlo,monospace}
svg .lbl,svg .val,svg .tick,svg .colhead,svg .note{fill:var(--fg)}
svg .tick,svg .note{fill:var(--muted)}svg .colhead{font-weight:600}
svg .grid{stroke:var(--line);stroke-width:1}
svg .zebra{fill:var(--zebra)}
svg .bar:hover .lbl{font-weight:700}
.note{color:var(--muted);font-size:12.5px;margin:6px 0}
table{border-collapse:collapse;width:100%;font-size:12.5px;font-variant-numeric:tabular-nums}
.tablewrap{max-height:80vh;overflow:auto;border:1px solid var(--line);border-radius:10px}
th,td{padding:4px 8px;border-bottom:1px solid var(--line);text-align:left;white-space:nowrap}
th{position:sticky;top:0;background:var(--card);font-weight:600;cursor:pointer;user-select:none;z-index:1}
th .arrow{color:var(--muted);margin-left:4px;font-size:10px}
th[aria-sort=ascending] .arrow{color:var(--accent)}
tbody tr:nth-child(even){background:var(--zebra)}
tbody tr:hover{background:rgba(63,111,168,.12)}
td.num{text-align:right}
td.streams{white-space:normal;min-width:420px}
td.name{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;max-width:420px;overflow:hidden;text-overflow:ellipsis}
.mini{display:inline-block;height:8px;border-radius:2px;background:var(--accent);vertical-align:0;margin-right:6px;opacity:.75}
.chip{display:inline-block;border-left:4px solid;padding:0 5px;margin:1px 3px 1px 0;background:var(--card);
border-radius:2px}
.status-ok{color:#3f9a5a}.status-bad{color:#e15759}
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


def _base_card(fig) -> str:
    b = fig["base"]
    if b is None:
        if fig["kind"] == "delta":
            return _card("base", "not checked", "give --base to check it against the file")
        return _card("base", "not needed", "a keyframe rebuilds without a base" if fig["kind"] == "keyframe" else "")
    bad = len(b["differs"]) + len(b["missing"]) + len(b["mismatch"])
    if bad:
        parts = [f"{len(b[k])} {k}" for k in ("differs", "missing", "mismatch") if b[k]]
        return _card("base", f"{bad} of {fig['tensor_count']} wrong", ", ".join(parts), "bad")
    if b["ok"]:
        return _card("base", "matches", f"{b['ok']} tensors checked by hash", "good")
    return _card("base", "compared", f"{b['present']} keyframe tensors compared value by value", "good")


def _table(fig: dict, cap: int) -> tuple[str, int]:
    tensors = fig["tensors"]
    keep, left = _pick(tensors, cap)
    with_base = fig["base"] is not None
    cols = ["#", "tensor", "dtype", "shape", "elements", "changed", "changed %", "bytes", "% of file",
            "bits / changed", "encodings", "streams (role: codec, stored)"] + (["base"] if with_base else [])
    head = "".join(
        f'<th scope="col"{" aria-sort=" + chr(34) + "ascending" + chr(34) if c == "#" else ""}>{_e(c)}'
        f'<span class="arrow">{"▲" if c == "#" else "⇅"}</span></th>' for c in cols)
    file_bytes = max(fig["file_bytes"], 1)
    bmax = max((t["bytes"] for t in tensors), default=1)
    rows = []
    for i in keep:
        t = tensors[i]
        chips = "".join(
            f'<span class="chip" style="border-color:{ROLE_COLORS.get(r["role"], _FALLBACK)}">{_e(r["role"])}: '
            f'{_e(r["codec"])}, {_e(fmt_bytes(r["stored"]))}</span>' for r in t["streams"]) or \
            ('<span class="note">none</span>')
        per_changed = f'{8 * t["bytes"] / t["changed"]:.1f}' if t["changed"] else "—"
        changed = "?" if t["changed"] is None else fmt_int(t["changed"])
        mini = f'<span class="mini" style="width:{_num(60 * t["bytes"] / bmax)}px"></span>'
        cells = [
            f'<td class="num">{i}</td>',
            f'<td class="name">{_e(t["name"])}</td>',
            f'<td>{_e(t["dtype"])}</td>',
            f'<td>{_e(_shape(t["shape"]))}</td>',
            f'<td class="num" data-value="{t["elements"]}">{fmt_int(t["elements"])}</td>',
            f'<td class="num" data-value="{"" if t["changed"] is None else t["changed"]}">{changed}</td>',
            f'<td class="num">{_e(fmt_pct(t["changed_fraction"]))}</td>',
            f'<td class="num" data-value="{t["bytes"]}">{mini}{_e(fmt_bytes(t["bytes"]))}</td>',
            f'<td class="num">{_e(fmt_pct(t["bytes"] / file_bytes))}</td>',
            f'<td class="num">{_e(per_changed)}</td>',
            f'<td>{_e(", ".join(t["encodings"]) or "—")}</td>',
            f'<td class="streams">{chips}</td>',
        ]
        if with_base:
            st = t["base_status"]
            cls = "status-ok" if st in ("ok", "present") else "status-bad"
            cells.append(f'<td class="{cls}">{_e(st)}</td>')
        rows.append(f'<tr data-name="{_e(t["name"])}">{"".join(cells)}</tr>')
    table = (f'<div class="tablewrap"><table id="tensor-table"><thead><tr>{head}</tr></thead>'
             f'<tbody>{"".join(rows)}</tbody></table></div>')
    return table, left


def _legend(keys, colors) -> str:
    return '<div class="legend">' + "".join(
        f'<span class="key"><i style="background:{colors.get(k, _FALLBACK)}"></i>{_e(k)}</span>'
        for k in keys) + "</div>"


def _capped(left: int, total: int, shown: int, what: str) -> str:
    if not left:
        return ""
    return (f'<p class="note">Showing the {shown} largest of {total} tensors (by bytes, in file order); '
            f'{left} smaller ones are left out of this {what}. <code>--json</code> has them all.</p>')


def render_html(fig: dict, *, max_bars: int = 1000, max_rows: int = 5000) -> str:
    """The page for figures from :func:`report_figures`. Charts draw at most ``max_bars`` tensors and the
    table at most ``max_rows`` (the largest by bytes); every chart scrolls."""
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
    roles = [(k, v, ROLE_COLORS.get(k, _FALLBACK)) for k, v in fig["bytes_by_role"].items()]
    codecs = [(k, v, CODEC_COLORS.get(k, _FALLBACK)) for k, v in fig["bytes_by_codec"].items()]
    encs = [(k, fig["elements_by_encoding"][k], ENCODING_COLORS.get(k, _FALLBACK))
            for k in sorted(fig["elements_by_encoding"], key=lambda k: -fig["elements_by_encoding"][k])]
    summary = (_stacked("summary-roles", roles, "file bytes by stream role", fmt_bytes)
               + _stacked("summary-codecs", codecs, "stream bytes by codec", fmt_bytes)
               + _stacked("summary-encodings", encs, "values by block encoding", lambda v: f"{fmt_int(v)} values"))
    used = ", ".join(f"{k} ({fmt_int(fig['blocks_by_encoding'][k])} blocks)" for k in fig["blocks_by_encoding"])

    body = [f'<header><h1>{_e(title)}<span class="badge {badge_cls}">{_e(fig["kind"])}</span></h1>'
            f'<p class="sub">arcfmt {_e(fig["format_version"])} · {_e(fmt_bytes(fig["file_bytes"]))} · '
            f'{fmt_int(n)} tensors · encodings used: {_e(used) or "none"}</p>'
            f'<div class="cards">{"".join(cards)}</div>{ids}</header>',
            f'<section id="summary"><h2>Where the bytes go</h2>{summary}</section>']
    if n:
        bchart, left = bytes_chart(fig, max_bars)
        shown = n - left
        role_keys = [k for k in fig["bytes_by_role"] if k != FILE_OVERHEAD]
        body.append(
            '<section id="bytes"><h2>Bytes per tensor, by stream</h2>'
            '<p class="hint">Stored bytes of each stream role (SPEC.md §8) and of the record headers; '
            'hover a segment for its codec and size.</p>'
            f'{_legend(role_keys, ROLE_COLORS)}{_capped(left, n, shown, "chart")}'
            f'<div class="scroll">{bchart}</div></section>')
        cchart, _ = changed_chart(fig, max_bars)
        enc_keys = [k for k in ENCODING_COLORS if k in fig["blocks_by_encoding"]]
        enc_mixed = ["mixed"] if any(len(t["encodings"]) > 1 for t in fig["tensors"]) else []
        body.append(
            '<section id="changed"><h2>Changed fraction per tensor</h2>'
            '<p class="hint">Changed values ÷ values. Coloured by encoding (purple-pink: several). Hatched: '
            'not known from the file (keyframe blocks); a base counts them.</p>'
            f'{_legend(enc_keys + enc_mixed, {**ENCODING_COLORS, "mixed": CODEC_COLORS["mixed"]})}'
            f'{_capped(left, n, shown, "chart")}<div class="scroll">{cchart}</div></section>')
        kchart, _ = codec_chart(fig, max_bars)
        codec_keys = [k for k in CODEC_COLORS if k in fig["bytes_by_codec"]] + (
            ["mixed"] if any(r["codec"] == "mixed" for t in fig["tensors"] for r in t["streams"]) else [])
        body.append(
            '<section id="codecs"><h2>Codec chosen per stream</h2>'
            '<p class="hint">The smallest of raw, zstd, xz and bz2 per stream and block; '
            '"mixed" when the blocks of a tensor chose differently.</p>'
            f'{_legend(codec_keys, CODEC_COLORS)}{_capped(left, n, shown, "chart")}'
            f'<div class="scroll">{kchart}</div></section>')
        table, tleft = _table(fig, max_rows)
        body.append(f'<section id="table"><h2>All tensors</h2>{_capped(tleft, n, n - tleft, "table")}{table}</section>')
    else:
        body.append('<section id="table"><h2>All tensors</h2><p class="note">This file holds no tensors.</p></section>')
    body.append(f'<footer>arcfmt {_e(__version__)} report · stream roles as in SPEC.md §8 · '
                f'one self-contained page, no scripts</footer>')
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{_e(title)}</title><style>{CSS}</style></head><body><main>'
            + "".join(body) + "</main></body></html>\n")


def render_report(delta_path_or_bytes, base=None, *, max_bars: int = 1000, max_rows: int = 5000) -> str:
    """One self-contained HTML page describing a delta (see the module docstring).

    ``delta_path_or_bytes``: a path, bytes, a binary file object or a DeltaReader; ``base``: optional,
    name → array or a checkpoint path (checks the base and counts changes in keyframe blocks).
    """
    return render_html(report_figures(delta_path_or_bytes, base), max_bars=max_bars, max_rows=max_rows)
