#!/usr/bin/env python3
"""Synthetic training trajectories, for checking that arcfmt's coding holds beyond the shared corpus.

    python tools/synth_trajectory.py OUT_DIR [--optimizer adam|sgd] [--lr 1e-6] [--master fp32|bf16]
                                     [--steps 12] [--layers 4] [--hidden 256] [--vocab 8000] [--seed 0]

Writes OUT_DIR/step0000.safetensors … (BF16, a Llama-shaped model) by running an optimizer on
structured random gradients: low-rank plus noise for linear layers, a few sampled token rows for the
embedding, small dense gradients for norms. `--master fp32` keeps FP32 master weights and saves their
BF16 cast (mixed-precision training); `--master bf16` updates BF16 weights in place, so an update
smaller than half an ulp is lost (pure-BF16 training). Adam moves every weight by about the learning
rate; SGD by the gradient times the learning rate, so its change pattern follows gradient scale, not
only the exponent. Feed the folder to tools/bench.py.
"""
from __future__ import annotations

import argparse
import os
import sys

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from arcfmt.safetensors_io import write_file  # noqa: E402

BF16 = ml_dtypes.bfloat16


def shapes(layers, hidden, vocab):
    inter = hidden * 4
    out = [("embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"layers.{i}."
        out += [(p + "input_norm.weight", (hidden,)), (p + "q_proj.weight", (hidden, hidden)),
                (p + "k_proj.weight", (hidden // 4, hidden)), (p + "v_proj.weight", (hidden // 4, hidden)),
                (p + "o_proj.weight", (hidden, hidden)), (p + "post_norm.weight", (hidden,)),
                (p + "up_proj.weight", (inter, hidden)), (p + "down_proj.weight", (hidden, inter)),
                (p + "up_proj.bias", (inter,))]
    out += [("norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden)), ("lm_head.bias", (vocab,))]
    return out


def init(rng, name, shape):
    if name.endswith("norm.weight"):
        return (1.0 + rng.standard_normal(shape) * 0.02).astype(np.float32)
    if name.endswith(".bias"):
        return (rng.standard_normal(shape) * 0.01).astype(np.float32)
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def gradient(rng, name, shape, vocab):
    if len(shape) == 1:
        return rng.standard_normal(shape).astype(np.float32) * 1e-3
    rows, cols = shape
    if rows == vocab and name.startswith("embed"):  # only sampled tokens get a gradient
        g = np.zeros(shape, np.float32)
        hit = rng.choice(rows, size=max(1, rows // 20), replace=False)
        g[hit] = rng.standard_normal((hit.size, cols)).astype(np.float32) * 1e-3
        return g
    k = 4
    a = rng.standard_normal((rows, k)).astype(np.float32)
    b = rng.standard_normal((k, cols)).astype(np.float32)
    return (a @ b) * 1e-4 + rng.standard_normal(shape).astype(np.float32) * 3e-4


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--master", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.out, exist_ok=True)
    names = shapes(args.layers, args.hidden, args.vocab)
    w = {n: init(rng, n, s) for n, s in names}
    if args.master == "bf16":
        w = {n: v.astype(BF16) for n, v in w.items()}
    m = {n: np.zeros(s, np.float32) for n, s in names}
    v = {n: np.zeros(s, np.float32) for n, s in names}
    for step in range(args.steps + 1):
        write_file(os.path.join(args.out, f"step{step:04d}.safetensors"),
                   {n: w[n].astype(BF16) if w[n].dtype != BF16 else w[n] for n, _ in names})
        if step == args.steps:
            break
        t = step + 1
        for n, s in names:
            g = gradient(rng, n, s, args.vocab)
            if args.optimizer == "adam":
                m[n] = 0.9 * m[n] + 0.1 * g
                v[n] = 0.999 * v[n] + 0.001 * g * g
                upd = (m[n] / (1 - 0.9 ** t)) / (np.sqrt(v[n] / (1 - 0.999 ** t)) + 1e-8)
            else:
                m[n] = 0.9 * m[n] + g
                upd = m[n] * 100.0  # SGD's lr is relative to a gradient of ~1e-3 .. 1e-4
            new = w[n].astype(np.float32) - args.lr * upd
            w[n] = new.astype(BF16) if args.master == "bf16" else new
    print(f"wrote {args.steps + 1} checkpoints of {sum(int(np.prod(s)) for _, s in names)} parameters to {args.out}")


if __name__ == "__main__":
    main()
