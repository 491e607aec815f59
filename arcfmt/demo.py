"""The built-in example: a small transformer-shaped model, one RL-like step, encode → apply → verify."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time

import ml_dtypes
import numpy as np

from .checkpoint import apply_delta, encode_checkpoints
from .reader import DeltaReader
from .safetensors_io import INDEX_NAME, write_file


def make_model_pair(seed: int = 0, layers: int = 2, d: int = 128, vocab: int = 4000, lr: float = 3e-6):
    """A BF16 model and the next step of it, the way an RL trainer makes them: FP32 master weights take
    one small Adam-like step (about ``lr`` per weight) and are cast to BF16, so only a few percent of the
    BF16 values change, mostly by one unit in the last place. Norm weights stay FP32."""
    rng = np.random.default_rng(seed)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (d, d),
                       p + "self_attn.v_proj.weight": (d, d), p + "self_attn.o_proj.weight": (d, d),
                       p + "mlp.up_proj.weight": (4 * d, d), p + "mlp.down_proj.weight": (d, 4 * d),
                       p + "input_layernorm.weight": (d,)})
    shapes["model.norm.weight"] = (d,)
    base, target = {}, {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            w = (1 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
            base[name] = w
            target[name] = (w + lr * rng.standard_normal(shape).astype(np.float32)
                            * (rng.random(shape) < 0.3)).astype(np.float32)
            continue
        master = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        step = lr * np.sign(rng.standard_normal(shape)).astype(np.float32) * rng.random(shape).astype(np.float32)
        if name.endswith("embed_tokens.weight"):
            step[rng.random(shape[0]) < 0.8] = 0  # tokens that were not sampled get no gradient
        base[name] = master.astype(ml_dtypes.bfloat16)
        target[name] = (master + step).astype(ml_dtypes.bfloat16)
    return base, target


def save_sharded(folder: str, tensors: dict, shards: int = 2) -> None:
    """Save as a Hugging Face style folder: several shards and model.safetensors.index.json."""
    os.makedirs(folder, exist_ok=True)
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    total = 0
    for k in range(shards):
        part = names[k * per:(k + 1) * per]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_file(os.path.join(folder, fname), {n: tensors[n] for n in part}, metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
        total += sum(tensors[n].nbytes for n in part)
    with open(os.path.join(folder, INDEX_NAME), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def _digest_folder(folder: str) -> dict:
    out = {}
    for n in sorted(os.listdir(folder)):
        with open(os.path.join(folder, n), "rb") as f:
            out[n] = hashlib.sha256(f.read()).hexdigest()
    return out


def run_demo(workdir: str | None = None, seed: int = 0) -> dict:
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="arcfmt-demo-")
        workdir = tmp.name
    try:
        base, target = make_model_pair(seed)
        bdir, tdir, odir = (os.path.join(workdir, n) for n in ("step0000", "step0001", "rebuilt-step0001"))
        delta_path = os.path.join(workdir, "step0001.arc")
        save_sharded(bdir, base)
        save_sharded(tdir, target)
        t0 = time.perf_counter()
        w = encode_checkpoints(bdir, tdir, delta_path, base_step=0, target_step=1)
        t1 = time.perf_counter()
        if os.path.exists(odir):
            import shutil
            shutil.rmtree(odir)
        apply_delta(bdir, delta_path, odir)
        t2 = time.perf_counter()
        exact = _digest_folder(odir) == _digest_folder(tdir)
        model_bytes = sum(a.nbytes for a in target.values())
        changed = sum(int(np.count_nonzero(base[n].view(np.uint8) != target[n].view(np.uint8)))
                      for n in base)
        changed_values = sum(b.changed or 0 for t in w.stats for b in t.blocks)
        size = w.size
        assert size is not None  # encode_checkpoints returns the writer closed
        desc = DeltaReader(open(delta_path, "rb").read()).describe()
        enc = sorted({e for t in desc["tensors"] for e in t["encodings"]})
        res = dict(workdir=workdir if tmp is None else None, tensors=len(target), model_bytes=model_bytes,
                   delta_bytes=size, ratio_percent=100 * size / model_bytes, changed_values=changed_values,
                   bytes_per_changed_value=size / max(changed_values, 1), encode_s=t1 - t0, apply_s=t2 - t1,
                   bit_exact=exact, encodings=enc)
        lines = [
            "arcfmt demo: a 2-layer BF16 model (FP32 norms) and its next RL step, stored as 2 safetensors shards",
            f"  model          {model_bytes / 1e6:8.2f} MB in {len(target)} tensors",
            f"  changed values {changed_values:8d} "
            f"({100 * changed_values / sum(a.size for a in target.values()):.2f} % of all values)",
            f"  delta file     {size / 1e3:8.2f} kB = {res['ratio_percent']:.3f} % of the model, "
            f"{res['bytes_per_changed_value']:.2f} bytes per changed value",
            f"  encodings used {', '.join(enc)}",
            f"  encode {res['encode_s'] * 1e3:.0f} ms, apply + verify {res['apply_s'] * 1e3:.0f} ms",
            f"  rebuilt checkpoint files identical to the target (sha256): {'yes' if exact else 'NO'}",
        ]
        if tmp is None:
            lines.append(f"  files kept in {workdir}")
        res["text"] = "\n".join(lines)
        del changed
        return res
    finally:
        if tmp is not None:
            tmp.cleanup()
