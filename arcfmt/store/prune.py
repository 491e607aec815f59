"""Retention: delete what no follower within the window needs (SPEC.md S16).

Without it a stream's objects pile up forever. :func:`prune` reads the head once, lists ``steps/``
once, walks the head's chain back through the newest ``keep_last`` committed steps and on to the
keyframe the oldest of them needs, and deletes only *whole step folders strictly below* that
keyframe chain (but for ``keep_keyframes`` rollback keyframe steps): committed steps, lost or
unfinished claims, orphaned data objects. Nothing at or above the oldest kept step, nothing newer
than the head it read and nothing whose name is not a stream name is ever touched, so a step being
published meanwhile survives. Deletions go manifests first, then descriptors, then data objects, so
that a follower never finds a manifest whose objects are gone without first finding the manifest
gone (it then re-plans from a kept keyframe, SPEC.md S9.5), and a prune killed at any point leaves
a stream that a rerun finishes.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ..errors import ArcError, ChecksumError, InputError, LimitError
from . import names as N
from . import retry
from .backends import Listed, Store
from .errors import MissingError
from .objects import (
    MAX_HEAD_BYTES,
    MAX_MANIFEST_BYTES,
    Manifest,
    check_own_name,
    digest128,
    own_name,
    parse_head,
    parse_manifest,
)

MAX_WALK = 1 << 20            # manifests one prune may read along the head's chain (as a plan walk, S12)
PHASES = ("manifest", "signature", "descriptor", "data")


@dataclass
class PruneResult:
    """What :func:`arcfmt.store.prune` kept and deleted (or, with ``dry_run``, would delete)."""

    head: int | None                  # the head's step as read (None: no head, nothing done)
    window: list = field(default_factory=list)      # the newest keep_last steps of the chain, oldest first
    kept: list = field(default_factory=list)        # every chain step kept: window + back to its keyframe
    rollback: list = field(default_factory=list)    # keyframe steps kept by keep_keyframes
    pruned_steps: list = field(default_factory=list)  # step folders emptied (or, dry run, that would be)
    deleted: list = field(default_factory=list)     # object names, in deletion order
    deleted_bytes: int = 0
    kept_bytes: int = 0               # what stays under steps/ (stream objects)
    other: int = 0                    # objects with non-stream names: never touched
    dry_run: bool = False
    seconds: float = 0.0

    def as_dict(self, names: bool = False) -> dict:
        """The result as a JSON-ready dict; the deleted object names only with ``names``."""
        d = asdict(self)
        d["deleted_objects"] = len(self.deleted)
        if not names:
            d.pop("deleted")
        return d


def _chain(st: Store, step: int, digest: str, keep_last: int) -> list:
    """The head's chain, newest first: ``keep_last`` manifests, then on to the first keyframe. A
    manifest missing after a keyframe was found ends it (pruned before); one missing before any
    keyframe, a wrong hash or a manifest that does not parse stops the prune (nothing deleted)."""
    chain: list[Manifest] = []
    while True:
        if len(chain) >= MAX_WALK:
            raise LimitError(f"more than {MAX_WALK} manifests on the head's chain before a keyframe")
        name = N.manifest_name(step)
        raw = st.read(name, MAX_MANIFEST_BYTES, missing_ok=True)
        if raw is None:
            if any(m.keyframe for m in chain):
                return chain
            raise MissingError(f"{name} is missing before any keyframe on the head's chain: nothing pruned")
        if digest128(raw) != digest:
            raise ChecksumError(f"{name} does not hash to the value its successor (or the head) holds: nothing pruned")
        m = parse_manifest(raw, name)
        check_own_name(m, name, f"{name} (nothing pruned)")
        chain.append(m)
        if len(chain) >= keep_last and m.keyframe:
            return chain
        if m.base_step is None or m.base_manifest is None:
            return chain
        step, digest = m.base_step, m.base_manifest


def _rollback(st: Store, by: dict, below: int, want: int) -> list:
    """The ``want`` newest committed keyframe steps below ``below``: candidates by their objects'
    names, each confirmed by reading its manifest (at most 4 × want + 16 reads)."""
    if want <= 0:
        return []
    cands = []
    for s in sorted((s for s in by if s < below), reverse=True):
        objs = by[s]
        if not any(e.kind == "manifest" for e in objs):
            continue
        ns = {e.num_shards for e in objs if e.kind == "keyframe"}
        if len(ns) == 1:
            n = next(iter(ns))
            if len({e.shard for e in objs if e.kind == "keyframe"}) == n:
                cands.append(s)
    out: list[int] = []
    for s in cands[: 4 * want + 16]:
        name = N.manifest_name(s)
        raw = st.read(name, MAX_MANIFEST_BYTES, missing_ok=True)
        if raw is None:
            continue
        try:
            m = parse_manifest(raw, name)
        except ArcError:
            continue
        if own_name(m) == name and m.keyframe:
            out.append(s)
            if len(out) >= want:
                break
    return sorted(out)


def _phase(e: Listed) -> int:
    """Deletion order within the doomed steps: manifests, their signatures (S15), descriptors, data."""
    return {"manifest": 0, "signature": 1, "descriptor": 2}.get(e.kind, 3)


def prune(url: str | None = None, *, keep_last: int, keep_keyframes: int = 0, dry_run: bool = False,
          storage_options: dict | None = None, fs=None, store: Store | None = None,
          retries: int = retry.DEFAULT_RETRIES, progress=None) -> PruneResult:
    """Delete every step folder no follower within the newest ``keep_last`` committed steps needs.

    Kept: the newest ``keep_last`` steps on the head's chain; the chain below them back to the
    keyframe the oldest one needs; ``keep_keyframes`` more committed keyframe steps below that (whole,
    for rollback); and everything at or above the oldest kept step. Deleted: every stream object of
    every other step folder below it. ``dry_run``: report, delete nothing. ``progress``: called with
    each batch of names just deleted."""
    t0 = time.perf_counter()
    keep_last = retry.check_count(keep_last, "keep_last", 1)
    keep_keyframes = retry.check_count(keep_keyframes, "keep_keyframes")
    if store is None:
        if url is None:
            raise InputError("prune needs a stream URL or a Store")
        store = Store(url, storage_options, fs=fs, retries=retries)
    st = store
    res = PruneResult(None, dry_run=bool(dry_run))
    raw_head = st.read(N.HEAD, MAX_HEAD_BYTES, missing_ok=True)
    if raw_head is None:
        res.seconds = time.perf_counter() - t0
        return res
    head = parse_head(raw_head)       # read once: everything it does not name as old stays
    res.head = head.step
    entries = st.list(N.STEPS)
    res.other = sum(1 for e in entries if e.kind == "other")
    chain = _chain(st, head.step, head.manifest, keep_last)
    res.window = sorted(m.step for m in chain[:keep_last])
    res.kept = sorted(m.step for m in chain)
    oldest = res.kept[0]
    by: dict[int, list[Listed]] = {}
    for e in entries:
        if e.step is not None:
            by.setdefault(e.step, []).append(e)
    res.rollback = _rollback(st, by, oldest, keep_keyframes)
    keep = set(res.rollback)
    doomed = sorted(s for s in by if s < oldest and s not in keep)
    res.pruned_steps = doomed
    victims = [e for s in doomed for e in by[s]]
    res.deleted_bytes = sum(e.size for e in victims)
    res.kept_bytes = sum(e.size for e in entries if e.kind != "other") - res.deleted_bytes
    ordered = sorted(victims, key=lambda e: (_phase(e), e.step, e.name))
    if not dry_run:
        for ph in range(len(PHASES)):
            names = [e.name for e in ordered if _phase(e) == ph]
            for b in range(0, len(names), 256):
                batch = names[b: b + 256]
                st.delete(batch)
                res.deleted.extend(batch)
                if progress is not None:
                    progress(batch)
        st.remove_empty_step_folders(oldest, keep)   # and those a killed prune emptied
    else:
        res.deleted = [e.name for e in ordered]
    res.seconds = time.perf_counter() - t0
    return res


__all__ = ["prune", "PruneResult"]
