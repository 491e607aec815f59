"""Torch for rollout engines: live weights as CPU torch tensors, a step's sparse update onto any device.

    import arcfmt, arcfmt.torch as at
    live = at.load_checkpoint("models/run42", pin_memory=True)      # the engine's CPU mirror
    follower = arcfmt.Follower(url, live=live, snapshot="models/run42", snapshot_every=50)
    for update in follower.follow():
        at.apply_sparse(engine_params, update)        # index_copy_ of only the changed values, any device

Only this module imports torch (``pip install arcfmt[torch]``); the rest of arcfmt takes torch tensors
as they come (viewed, never cast), and ``arcfmt.decode`` / ``DeltaReader.decode`` give torch tensors back
for torch bases (or ``framework="pt"``) through :func:`from_decoded`, imported only then.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import numpy as np

from .arrays import as_numpy
from .errors import InputError

try:
    import torch
except ImportError as _exc:  # pragma: no cover - the extra is not installed
    raise ImportError("arcfmt.torch needs PyTorch: pip install 'arcfmt[torch]'") from _exc

# numpy (ml_dtypes) dtypes that torch holds under another name: viewed through an integer of their width
_VIEWED = {"bfloat16": (np.int16, torch.bfloat16), "float8_e4m3fn": (np.uint8, getattr(torch, "float8_e4m3fn", None)),
           "float8_e5m2": (np.uint8, getattr(torch, "float8_e5m2", None))}


def to_torch(array: Any) -> torch.Tensor:
    """A CPU torch tensor sharing ``array``'s memory (numpy or ml_dtypes; BF16 and FP8 included); a
    read-only array (a memory-mapped file) is copied, as torch has no read-only tensors."""
    if isinstance(array, torch.Tensor):
        return array
    a = np.ascontiguousarray(as_numpy(array))
    if not a.flags.writeable:
        a = a.copy()
    viewed = _VIEWED.get(a.dtype.name)
    if viewed is not None and viewed[1] is not None:
        return torch.from_numpy(a.view(viewed[0])).view(viewed[1])
    return torch.from_numpy(a)


def from_decoded(arrays: Mapping[str, Any], base: Any = None, device: Any = None) -> dict[str, Any]:
    """Decoded arrays (name → numpy) as torch tensors sharing their memory, for ``arcfmt.decode`` and
    ``DeltaReader.decode`` with torch output. Each goes to ``device`` when given, else to the device of
    the same-named torch tensor in ``base`` (a mapping, or one tensor), else to the first torch base
    tensor's device, else stays on the CPU."""
    torch_base: dict[str, Any] = {}
    if isinstance(base, Mapping):
        torch_base = {k: v for k, v in base.items() if isinstance(v, torch.Tensor)}
    elif isinstance(base, torch.Tensor):
        torch_base = {n: base for n in arrays}
    first = next(iter(torch_base.values())).device if torch_base else None
    out = {}
    for name, arr in arrays.items():
        t = to_torch(arr)
        where = device
        if where is None:
            b = torch_base.get(name)
            where = b.device if b is not None else first
        if where is not None and torch.device(where) != t.device:
            t = t.to(where)
        out[name] = t
    return out


def load_checkpoint(path: str | os.PathLike, *, pin_memory: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file or checkpoint folder, copied into CPU torch tensors of their own
    (page-locked with ``pin_memory``, for fast copies to a GPU): a live model a Follower can update."""
    from .safetensors_io import open_checkpoint

    if pin_memory:
        try:
            torch.empty(1, pin_memory=True)
        except RuntimeError as exc:   # no accelerator here: page-locked memory would serve nothing
            warnings.warn(f"pin_memory ignored: {exc}", stacklevel=2)
            pin_memory = False
    out: dict[str, torch.Tensor] = {}
    for name, arr in open_checkpoint(os.fspath(path)).tensors().items():
        dtype = to_torch(np.empty(0, arr.dtype)).dtype
        t = torch.empty(tuple(arr.shape), dtype=dtype, pin_memory=pin_memory)
        as_numpy(t)[...] = arr    # straight from the file's pages into the tensor: one copy
        out[name] = t
    return out


def sparse(update: Any, device: Any = None) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(name, index, values)`` per changed tensor of a live step as torch tensors (index int64, as
    ``index_copy_`` wants; values in the tensor's dtype), on ``device`` when given."""
    for name, index, values in update.sparse():
        idx = torch.from_numpy(np.asarray(index, np.int64))
        vals = to_torch(values)
        if device is not None:
            idx, vals = idx.to(device, non_blocking=True), vals.to(device, non_blocking=True)
        yield name, idx, vals


def apply_sparse(params: Mapping[str, torch.Tensor], update: Any, *, strict: bool = True) -> int:
    """Write a live step's changed values into ``params`` (name → tensor, on any device) with
    ``index_copy_``; returns the number of values written. A tensor whose dtype or shape changed, or that
    is new (``update.fresh``), cannot be patched: ``InputError`` (install it from ``update.weights()``).
    ``strict``: a changed tensor missing from ``params`` is an error (else skipped)."""
    if update.fresh:
        raise InputError(f"step {update.step} changes the dtype or shape of (or adds) {sorted(update.fresh)[:5]}: "
                         f"load those from update.weights() instead")
    written = 0
    with torch.no_grad():
        for name, index, values in update.sparse():
            p = params.get(name)
            if p is None:
                if strict:
                    raise InputError(f"tensor {name!r} of step {update.step} is not among the parameters")
                continue
            flat = p.view(-1)   # a parameter that is not contiguous cannot be patched in place
            vals = to_torch(values)
            if vals.dtype != p.dtype or flat.numel() <= (int(index[-1]) if len(index) else -1):
                raise InputError(f"tensor {name!r}: the parameter is {p.dtype} of {flat.numel()} elements, the "
                                 f"update {vals.dtype}")
            idx = torch.from_numpy(np.asarray(index, np.int64)).to(p.device, non_blocking=True)
            flat.index_copy_(0, idx, vals.to(p.device, non_blocking=True))
            written += len(index)
    return written


def apply_weights(params: MutableMapping[str, torch.Tensor], update: Any) -> int:
    """Copy every changed tensor of a step whole into ``params`` (the ``load_weights`` way, for engines
    that take nothing else); returns the bytes copied."""
    copied = 0
    with torch.no_grad():
        for name, arr in update.weights():
            src = to_torch(arr)
            p = params.get(name)
            if p is None or p.shape != src.shape or p.dtype != src.dtype:
                params[name] = src.to(p.device if p is not None else "cpu").clone()
            else:
                p.copy_(src)
            copied += src.numel() * src.element_size()
    return copied


__all__ = ["apply_sparse", "apply_weights", "from_decoded", "load_checkpoint", "sparse", "to_torch"]
