"""Render `arcfmt report` pages and, where Chromium is installed, take headless screenshots of them.

    python tools/report_shots.py --out /tmp/report-shots            # demo + many-tensor pages
    python tools/report_shots.py --out /tmp/report-shots --delta x.arc --base ckpt/step0001 --sections
    python tools/report_shots.py --out /tmp/report-shots --tensors 5000 --layers 100

Writes, for each case, CASE.html and (with chromium/chromium-browser/google-chrome on PATH, or
$CHROMIUM) CASE.png, a full-page screenshot at --width; prints one line per case with the page size and
whether it is within the 1 MiB bound. Cases: "demo" (the pair `arcfmt demo` builds), "many" (a
synthetic model of --tensors small tensors in --layers layers, several blocks each, all of them changed
a little: the size bound is about tensor and block counts, not bytes), and "delta" (each --delta, with
the --base in the same position when given). With --sections, also CASE-SECTION.png: one section
alone, viewport-high, to read at full size. Look at the PNGs: names never clipped, every column
visible, colours told apart.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import arcfmt  # noqa: E402
from arcfmt.report import render_report  # noqa: E402

MAX_PAGE_BYTES = getattr(__import__("arcfmt.report").report, "MAX_PAGE_BYTES", 1 << 20)

ROLES_PER_LAYER = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                   "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                   "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")


def many_tensor_pair(tensors: int, layers: int, seed: int = 0, elems: int = 2048):
    """Base and target of ``tensors`` BF16 tensors (Llama-like names over ``layers`` layers, experts
    when there are more than the layers hold), ~1 % of values moved by one unit in the last place."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    base, target = {}, {}
    per_layer = max(1, tensors // max(layers, 1))
    k = 0
    for layer in range(layers):
        for j in range(per_layer):
            if k >= tensors:
                break
            role = ROLES_PER_LAYER[j % len(ROLES_PER_LAYER)]
            expert = j // len(ROLES_PER_LAYER)
            name = (f"model.layers.{layer}.{role}" if expert == 0 else
                    f"model.layers.{layer}.mlp.experts.{expert}.{role.split('.')[-2]}.weight")
            b = (rng.standard_normal(elems) * 0.02).astype(ml_dtypes.bfloat16)
            u = b.view(np.uint16).copy()
            u[rng.random(elems) < 0.01] += 1
            base[name], target[name] = b, u.view(ml_dtypes.bfloat16)
            k += 1
    return base, target


def chromium() -> str | None:
    for exe in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "chrome"):
        if exe and shutil.which(exe):
            return shutil.which(exe)
    return None


SECTIONS = ("summary", "largest", "groups", "codecs", "blocks", "table")


def screenshot(exe: str, page: str, png: str, width: int = 1400, height: int | None = None) -> None:
    """A screenshot of ``page`` (a file path); ``height`` None: tall enough for the whole page."""
    if height is None:
        height = 1200
        with open(page, encoding="utf-8") as f:
            text = f.read()
        height = max(height, min(16000, 40 * text.count("<tr") + 2400))
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([exe, "--headless", "--disable-gpu", "--no-sandbox",
                        f"--user-data-dir={profile}", f"--window-size={width},{height}",
                        f"--screenshot={png}", "file://" + os.path.abspath(page)],
                       check=True, capture_output=True, timeout=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/report-shots")
    ap.add_argument("--delta", action="append", default=[], help="also draw this delta file (repeatable)")
    ap.add_argument("--base", action="append", default=[],
                    help="the base checkpoint of the --delta in the same position ('-': none)")
    ap.add_argument("--tensors", type=int, default=3000)
    ap.add_argument("--layers", type=int, default=60)
    ap.add_argument("--block-elems", type=int, default=256, help="of the many-tensor model: several blocks each")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, help="screenshot height (default: from the page's length)")
    ap.add_argument("--sections", action="store_true",
                    help="also one viewport-high screenshot per section (CASE-SECTION.png), to read at full size")
    ap.add_argument("--no-shots", action="store_true", help="pages only")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    cases: list[tuple[str, object, object]] = []
    from arcfmt.demo import make_model_pair  # the demo's own model

    base, target = make_model_pair()
    cases.append(("demo", arcfmt.encode(base, target, base_step=0, target_step=1, effort="fast"), base))
    base, target = many_tensor_pair(args.tensors, args.layers)
    cases.append(("many", arcfmt.encode(base, target, base_step=7, target_step=8, block_elems=args.block_elems,
                                        effort="fast"), None))
    for k, path in enumerate(args.delta):
        base_path = args.base[k] if k < len(args.base) and args.base[k] != "-" else None
        cases.append((f"delta{k}" if len(args.delta) > 1 else "delta", path, base_path))

    exe = None if args.no_shots else chromium()
    if exe is None and not args.no_shots:
        print("no chromium found (set $CHROMIUM): pages only", file=sys.stderr)
    worst = 0
    for name, delta, base in cases:
        page = render_report(delta, base)
        path = os.path.join(args.out, f"{name}.html")
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
        size = len(page.encode("utf-8"))
        worst = max(worst, size)
        line = f"{name}: {path} {size / 1024:.1f} KiB ({'within' if size <= MAX_PAGE_BYTES else 'OVER'} 1 MiB)"
        if exe:
            png = os.path.join(args.out, f"{name}.png")
            screenshot(exe, path, png, args.width, args.height)
            line += f", screenshot {png}"
            if args.sections:
                for sec in SECTIONS:  # a copy showing that section alone (headless shots do not scroll)
                    only = os.path.join(args.out, f"{name}-{sec}.html")
                    hide = f"<style>main>header,main>section:not(#{sec}){{display:none}}</style></head>"
                    with open(only, "w", encoding="utf-8") as f:
                        f.write(page.replace("</head>", hide, 1))
                    screenshot(exe, only, os.path.join(args.out, f"{name}-{sec}.png"), args.width, 1100)
                line += f" and {name}-<section>.png"
        print(line)
    return 0 if worst <= MAX_PAGE_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
