#!/usr/bin/env python3
"""Measure peer delta compressors on BF16 checkpoint pairs.

Run with the peers' own interpreter (/work/peers-venv/bin/python), never with
arcfmt's: this script does not import arcfmt, it only *calls* the installed
peer libraries through their public APIs.

    peers_worker.py --peer {arc_v3,arc_v2,z4ai} --base A.safetensors --target B.safetensors [--repeat N]
    peers_worker.py --peer P --pairs-file F [--repeat N]      # F: one "BASE TARGET" per line

For each pair one JSON line goes to stdout:

    {"peer", "base", "target", "bytes", "bf16_bytes", "changed",
     "encode_s", "decode_s", "exact", "error"}

bytes       size of everything the receiver needs besides its base checkpoint:
            arc_v2/arc_v3 -- the safetensors file of per-tensor compressed
            diffs plus the per-tensor checksums in its metadata, exactly what
            fireworks_delta_compression.delta_compress_dicts_to_file writes
            (serialized here in memory with safetensors.torch.save);
            z4ai -- the Z4DL frame(s) returned by z4ai.compress_delta.
bf16_bytes  total bytes of the target's tensors.
changed     elements whose bits differ between base and target.
encode_s    wall seconds, best of --repeat: state dicts in -> transfer bytes out.
decode_s    wall seconds, best of --repeat: transfer bytes + base state dict in ->
            reconstructed target state dict out (parse + decompress + apply).
exact       reconstruction is bit-identical to the target (compared as int16/uint8
            bit patterns, every tensor, same key set).

A peer that is not importable yields a single line with
"error": "not installed: ..." and exit status 0.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
import traceback
import warnings

PEERS = ("arc_v3", "arc_v2", "z4ai")


def _emit(rec: dict) -> None:
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def _record(peer, base, target, **kw) -> dict:
    rec = {
        "peer": peer,
        "base": base,
        "target": target,
        "bytes": None,
        "bf16_bytes": None,
        "changed": None,
        "encode_s": None,
        "decode_s": None,
        "exact": False,
        "error": None,
    }
    rec.update(kw)
    return rec


# --------------------------------------------------------------------------
# Peer adapters.  Each exposes encode(base_sd, target_sd) -> bytes and
# decode(blob, base_sd) -> state dict.  Only public peer APIs are called.
# --------------------------------------------------------------------------


class ArcPeer:
    """fireworks-delta-compression, formats arc_v2 (XOR + zstd) and arc_v3."""

    def __init__(self, fmt: str, workers: int):
        import fireworks_delta_compression as fdc  # noqa: F401 (import error -> not installed)
        import safetensors.torch as st

        self.fdc = fdc
        self.st = st
        self.fmt = fmt
        self.executor = None
        if workers > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.executor = ThreadPoolExecutor(max_workers=workers)

    def encode(self, base_sd: dict, target_sd: dict) -> bytes:
        # Same call delta_compress_dicts_to_file makes, then the same
        # serialization it uses (safetensors, checksums as metadata), in memory.
        diffs, checksums = self.fdc.delta_compress_dicts(
            base_sd, target_sd, compression_format=self.fmt, must_match=True, executor=self.executor
        )
        return self.st.save(diffs, metadata=checksums)

    @staticmethod
    def _metadata(blob: bytes) -> dict:
        (hlen,) = struct.unpack("<Q", blob[:8])
        return json.loads(blob[8 : 8 + hlen]).get("__metadata__", {}) or {}

    def decode(self, blob: bytes, base_sd: dict) -> dict:
        # In-memory equivalent of fdc.delta_decompress_dict_from_file: load the
        # diffs and checksums, then fdc.delta_decompress per tensor.
        checksums = self._metadata(blob)
        diffs = self.st.load(blob)
        if sorted(diffs) != sorted(base_sd):
            raise ValueError("delta keys do not match base keys")
        keys = list(diffs)
        if self.executor is None:
            outs = [
                self.fdc.delta_decompress(
                    src=base_sd[k], compressed_diff=diffs[k], checksum=checksums[k], compression_format=self.fmt
                )
                for k in keys
            ]
        else:
            futs = [
                self.executor.submit(
                    self.fdc.delta_decompress,
                    src=base_sd[k],
                    compressed_diff=diffs[k],
                    checksum=checksums[k],
                    compression_format=self.fmt,
                )
                for k in keys
            ]
            outs = [f.result() for f in futs]
        return dict(zip(keys, outs))


class Z4aiPeer:
    """z4ai.compress_delta / z4ai.decompress_delta.

    mode "whole": the state dict's tensors (in the target file's order) are
    laid end to end as one buffer -- the safetensors data section -- and one
    delta frame is made with dtype="bf16".  Mode "tensor": one frame per
    tensor, each length-prefixed in a simple container (4-byte count + 8-byte
    length per frame; that framing is counted in bytes).
    """

    def __init__(self, mode: str, threads: int):
        import numpy as np
        import torch
        import z4ai

        self.np = np
        self.torch = torch
        self.z4ai = z4ai
        self.mode = mode
        self.threads = threads
        self.keys = None
        self.meta = None

    @staticmethod
    def _zdtype(t) -> str | None:
        import torch

        return {
            torch.bfloat16: "bf16",
            torch.float16: "fp16",
            torch.float32: "fp32",
            torch.float64: "fp64",
        }.get(t.dtype)

    def _bytes(self, t):
        return t.contiguous().view(self.torch.uint8).reshape(-1).numpy()

    def encode(self, base_sd: dict, target_sd: dict) -> bytes:
        np = self.np
        keys = list(target_sd)
        if sorted(keys) != sorted(base_sd):
            raise ValueError("base and target keys differ")
        # The receiver already has key order / shapes / dtypes (from its base
        # checkpoint), so they are not counted as transferred bytes.
        self.keys = keys
        self.meta = {k: (target_sd[k].dtype, tuple(target_sd[k].shape), target_sd[k].nbytes) for k in keys}
        if self.mode == "whole":
            dts = {self._zdtype(target_sd[k]) for k in keys}
            zdt = dts.pop() if len(dts) == 1 else None
            cur = np.concatenate([self._bytes(target_sd[k]) for k in keys])
            ref = np.concatenate([self._bytes(base_sd[k]) for k in keys])
            return self.z4ai.compress_delta(cur, ref, dtype=zdt, threads=self.threads)
        frames = [
            self.z4ai.compress_delta(
                self._bytes(target_sd[k]), self._bytes(base_sd[k]), dtype=self._zdtype(target_sd[k]),
                threads=self.threads,
            )
            for k in keys
        ]
        out = bytearray(struct.pack("<I", len(frames)))
        for f in frames:
            out += struct.pack("<Q", len(f))
            out += f
        return bytes(out)

    def decode(self, blob: bytes, base_sd: dict) -> dict:
        np, torch = self.np, self.torch
        keys = self.keys
        out = {}
        if self.mode == "whole":
            ref = np.concatenate([self._bytes(base_sd[k]) for k in keys])
            raw = self.z4ai.decompress_delta(blob, ref)
            buf = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            off = 0
            for k in keys:
                dt, shape, nb = self.meta[k]
                out[k] = buf[off : off + nb].view(dt).reshape(shape)
                off += nb
            if off != buf.numel():
                raise ValueError("decoded length mismatch")
            return out
        (n,) = struct.unpack_from("<I", blob, 0)
        if n != len(keys):
            raise ValueError("frame count mismatch")
        pos = 4
        mv = memoryview(blob)
        for k in keys:
            (ln,) = struct.unpack_from("<Q", blob, pos)
            pos += 8
            raw = self.z4ai.decompress_delta(mv[pos : pos + ln], self._bytes(base_sd[k]))
            pos += ln
            dt, shape, nb = self.meta[k]
            out[k] = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt).reshape(shape)
        return out


def make_peer(name: str, args):
    if name in ("arc_v3", "arc_v2"):
        return ArcPeer(name, args.workers)
    if name == "z4ai":
        return Z4aiPeer(args.z4ai_mode, args.threads)
    raise ValueError(f"unknown peer {name}")


# --------------------------------------------------------------------------


def _int_view(t, torch):
    # Raw bit patterns, so NaN payloads / -0.0 compare exactly.
    if t.element_size() == 2:
        return t.contiguous().view(torch.int16)
    return t.contiguous().view(torch.uint8)


def run_pair(peer, peer_name, base_path, target_path, repeat, load) -> dict:
    import torch

    rec = _record(peer_name, base_path, target_path)
    try:
        base_sd = load(base_path)
        target_sd = load(target_path)
        rec["bf16_bytes"] = int(sum(t.nbytes for t in target_sd.values()))
        changed = 0
        for k, t in target_sd.items():
            b = base_sd.get(k)
            if b is None or b.shape != t.shape or b.dtype != t.dtype:
                changed += t.numel()
                continue
            changed += int((_int_view(b, torch) != _int_view(t, torch)).sum())
        rec["changed"] = changed

        blob = None
        sizes = []
        best = float("inf")
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            out = peer.encode(base_sd, target_sd)
            dt = time.perf_counter() - t0
            best = min(best, dt)
            sizes.append(len(out))
            if blob is None:
                blob = bytes(out)
        rec["encode_s"] = best
        rec["bytes"] = sizes[0]
        if len(set(sizes)) > 1:
            rec["bytes_runs"] = sizes  # arc_v3 picks among racing candidates by time

        best = float("inf")
        recon = None
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            recon = peer.decode(blob, base_sd)
            dt = time.perf_counter() - t0
            best = min(best, dt)
        rec["decode_s"] = best

        exact = sorted(recon) == sorted(target_sd)
        if exact:
            for k, t in target_sd.items():
                r = recon[k]
                if (r.dtype != t.dtype or r.shape != t.shape
                        or not torch.equal(_int_view(r, torch), _int_view(t, torch))):
                    exact = False
                    break
        rec["exact"] = bool(exact)
    except Exception as e:  # report, keep going with the next pair
        rec["error"] = f"{type(e).__name__}: {e}"
        if os.environ.get("PEERS_WORKER_TRACE"):
            traceback.print_exc(file=sys.stderr)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", required=True, choices=PEERS)
    ap.add_argument("--base")
    ap.add_argument("--target")
    ap.add_argument("--pairs-file", help='file with one "BASE TARGET" pair per line')
    ap.add_argument("--repeat", type=int, default=1, help="timings are best of N (default 1)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads / z4ai threads (default 2)")
    ap.add_argument(
        "--workers", type=int, default=1,
        help="arc_*: >1 passes a ThreadPoolExecutor(N) to the peer's dict API "
             "(default 1: the peer's default, sequential)",
    )
    ap.add_argument(
        "--arc3-wait-multiplier", type=float, default=None,
        help="arc_v3: sets the peer's ARC3_CANDIDATE_WAIT_MULTIPLIER (default: the peer's own, 1.5; "
        "its candidates race and late ones are dropped, so sizes vary run to run; 1e9 = wait for all)",
    )
    ap.add_argument("--z4ai-mode", choices=("whole", "tensor"), default="whole",
                    help="z4ai: one delta frame over all tensors (default) or one per tensor")
    args = ap.parse_args(argv)

    pairs = []
    if args.pairs_file:
        with open(args.pairs_file) as f:
            for line in f:
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                parts = line.split()
                if len(parts) != 2:
                    ap.error(f"bad line in {args.pairs_file}: {line!r}")
                pairs.append((parts[0], parts[1]))
    if args.base or args.target:
        if not (args.base and args.target):
            ap.error("--base and --target go together")
        pairs.append((args.base, args.target))
    if not pairs:
        ap.error("give --base/--target or --pairs-file")

    if args.arc3_wait_multiplier is not None:
        # read by the peer at import time
        os.environ["ARC3_CANDIDATE_WAIT_MULTIPLIER"] = repr(args.arc3_wait_multiplier)
    warnings.filterwarnings("ignore", message="The given buffer is not writable")

    try:
        import torch

        torch.set_num_threads(max(1, args.threads))
        from safetensors.torch import load_file

        peer = make_peer(args.peer, args)
    except ImportError as e:
        _emit(_record(args.peer, pairs[0][0] if len(pairs) == 1 else None,
                      pairs[0][1] if len(pairs) == 1 else None, error=f"not installed: {e}"))
        return 0

    cache: dict = {}  # keep the last two checkpoints: a trajectory reuses target as next base

    def load(path):
        if path not in cache:
            while len(cache) >= 2:
                cache.pop(next(iter(cache)))
            cache[path] = load_file(path)
        return cache[path]

    for base, target in pairs:
        _emit(run_pair(peer, args.peer, base, target, args.repeat, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
