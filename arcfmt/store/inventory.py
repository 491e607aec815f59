"""What a stream holds, from one listing: ``arcfmt status`` (SPEC.md S16.4, informative).

A stream of thousands of steps is summed up without reading thousands of objects: one listing of
``steps/`` gives every object's name, size and time; only the head, the manifests on the head's chain
back to its latest keyframe (what a new follower would fetch: :meth:`Follower.plan` itself does the
walk) and a bounded number of the newest manifests (for writer and kind) are read. Anything else a
step says about itself comes from the names of its objects.
"""
from __future__ import annotations

import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field

from ..errors import ArcError, FormatError, InputError
from . import names as N
from . import retry
from .backends import Listed, Store
from .objects import MAX_HEAD_BYTES, MAX_MANIFEST_BYTES, Manifest, own_name, parse_head, parse_manifest
from .publisher import why_blocked

DEFAULT_DETAILS = 16         # newest committed manifests read besides the head's keyframe chain
MAX_DETAILS = 4096
MAX_OTHER_LISTED = 100       # names of non-stream objects kept in a status (the count is always exact)
MAX_BLOCKED_CHECKS = 64      # newest uncommitted steps checked for "can never commit"


@dataclass
class StepInfo:
    """One step folder. ``kind`` and ``writer`` come from the manifest when it was read (``read``),
    else ``kind`` from the names of the step's data objects and ``writer`` is None."""

    step: int
    committed: bool                  # its manifest exists
    kind: str | None                 # "delta", "keyframe", "both" (None: no shard has every object yet)
    bytes: int                       # every stream object of the step folder
    objects: int
    shards: int | None               # shard count n, from the names (None: no shard object at all)
    descriptors: list = field(default_factory=list)   # shards whose descriptors exist
    missing: list = field(default_factory=list)       # shards whose descriptors do not (claims)
    writer: str | None = None
    age_seconds: float | None = None  # since its newest object was written (manifest: since commit)
    read: bool = False
    blocked: str | None = None        # an uncommitted step that can never commit: why (S8.2)


@dataclass
class HeadInfo:
    step: int
    manifest: str
    keyframe_step: int
    age_seconds: float


@dataclass
class StreamStatus:
    """What :func:`arcfmt.store.status` found in a stream: its head, committed and pending steps,
    keyframes, the path a new follower would take, and the objects and bytes stored."""

    url: str
    head: HeadInfo | None
    steps: list                      # StepInfo of every committed step, oldest first
    keyframes: list                  # committed steps with keyframes (by manifest or, unread, by names)
    pending: list                    # StepInfo of steps claimed but not committed, oldest first
    new_follower_path: list          # [(step, "keyframe" | "delta")]: what Follower.plan picks for a new folder
    new_follower_bytes: int | None   # bytes of the objects on that path (None: no path, see plan_error)
    plan_error: str | None
    total_bytes: int                 # every object listed under steps/, plus the head
    objects: int
    other: int                       # objects whose names are not stream names (never touched)
    other_names: list                # the first MAX_OTHER_LISTED of them
    manifests_read: int
    seconds: float
    head_error: str | None = None    # a head that exists but cannot be read (the rest is still shown)

    def as_dict(self) -> dict:
        """The status as a JSON-ready dict."""
        d = asdict(self)
        d["new_follower_path"] = [list(p) for p in self.new_follower_path]
        return d


def _group(entries) -> dict:
    """step → list of Listed (stream objects of ``steps/<S>/`` only)."""
    by: dict[int, list[Listed]] = {}
    for e in entries:
        if e.step is not None:
            by.setdefault(e.step, []).append(e)
    return by


def _from_names(step: int, objs: list, now: float) -> StepInfo:
    counts: dict[int, int] = {}
    for e in objs:
        if e.num_shards is not None:
            counts[e.num_shards] = counts.get(e.num_shards, 0) + 1
    n = max(counts, key=lambda k: (counts[k], k)) if counts else None
    committed = any(e.kind == "manifest" for e in objs)
    descs = sorted({e.shard for e in objs if e.kind == "descriptor" and e.num_shards == n and e.shard is not None})
    kinds = set()
    if n is not None:
        for k in ("delta", "keyframe"):
            if len({e.shard for e in objs if e.kind == k and e.num_shards == n}) == n:
                kinds.add(k)
    kind = "both" if len(kinds) == 2 else (next(iter(kinds)) if kinds else None)
    times = [e.mtime for e in objs if e.mtime is not None]
    man = [e.mtime for e in objs if e.kind == "manifest" and e.mtime is not None]
    t = man[0] if man else (max(times) if times else None)
    return StepInfo(step, committed, kind, sum(e.size for e in objs), len(objs), n, descs,
                    [] if n is None else [i for i in range(n) if i not in descs], None,
                    None if t is None else max(0.0, now - t))


def _apply_manifest(info: StepInfo, m: Manifest) -> None:
    info.kind = "both" if m.keyframe and m.base_step is not None else ("keyframe" if m.keyframe else "delta")
    info.writer = m.writer
    info.shards = m.num_shards
    info.read = True


def status(url: str, *, storage_options: dict | None = None, fs=None, store: Store | None = None,
           details: int = DEFAULT_DETAILS, retries: int = retry.DEFAULT_RETRIES) -> StreamStatus:
    """A stream's state from one listing of ``steps/`` and a few reads (see the module docstring).

    ``details``: the newest committed steps whose manifests are read for writer and kind, besides the
    head's chain back to its keyframe. Nothing is written anywhere."""
    from .follower import Follower

    t0 = time.perf_counter()
    details = retry.check_count(details, "details")
    if details > MAX_DETAILS:
        raise InputError(f"details must be at most {MAX_DETAILS}")
    st = store if store is not None else Store(url, storage_options, fs=fs, retries=retries)
    head_error = None
    try:   # a broken head is reported, not fatal: an operator needs the rest to repair it
        raw_head = st.read(N.HEAD, MAX_HEAD_BYTES, missing_ok=True)
        head = None if raw_head is None else parse_head(raw_head)
    except (FormatError, InputError) as exc:
        raw_head, head, head_error = None, None, f"{exc.category}: {exc}"
    entries = st.list(N.STEPS)
    now = time.time()
    by = _group(entries)
    infos = {s: _from_names(s, objs, now) for s, objs in sorted(by.items())}
    read: dict[int, Manifest] = {}
    path: list = []
    plan_error = None
    follower_bytes: int | None = None
    if head is not None:
        # A follower of a folder that does not exist (it is never created: plan() only reads the stream).
        ghost = os.path.join(tempfile.gettempdir(), f".arcfmt-status-{uuid.uuid4().hex}", "new")
        try:
            fol = Follower(url, ghost, fs=st.fs, retries=st.retries, backoff=st.backoff, spool=False)
            plan = fol.plan(head, None)
        except ArcError as exc:
            plan_error = f"{exc.category}: {exc}"
        else:
            path = [(m.step, kind) for m, kind in plan]
            follower_bytes = sum(m.cost(kind) for m, kind in plan)
            for m, _ in plan:
                read[m.step] = m
    recent = [s for s in sorted(infos, reverse=True) if infos[s].committed and s not in read][:details]
    if recent:
        names = [N.manifest_name(s) for s in recent]
        for s, raw in zip(recent, st.read_many(names, MAX_MANIFEST_BYTES)):
            if raw is None:
                continue
            try:
                m = parse_manifest(raw, N.manifest_name(s))
            except ArcError:
                continue          # status reports, it does not judge: the listing's view stays
            if own_name(m) == N.manifest_name(s):
                read[s] = m
    for s, m in read.items():
        if s in infos:
            _apply_manifest(infos[s], m)
    head_info = None
    if head is not None:
        head_info = HeadInfo(head.step, head.manifest, head.keyframe_step, max(0.0, now - head.time_ms / 1000))
        if head.step in read and read[head.step].digest != head.manifest:
            plan_error = plan_error or "checksum: the head's manifest does not hash to the head's value"
    committed = [i for i in infos.values() if i.committed]
    pending = [i for i in infos.values() if not i.committed]
    for i in pending[-MAX_BLOCKED_CHECKS:]:   # the newest: each costs a few small reads
        if i.shards is not None:
            i.blocked = why_blocked(st, i.step, i.shards)
    other = [e.name for e in entries if e.kind == "other"]
    return StreamStatus(
        url=url, head=head_info, steps=committed,
        keyframes=[i.step for i in committed if i.kind in ("keyframe", "both")],
        pending=pending,
        new_follower_path=path, new_follower_bytes=follower_bytes, plan_error=plan_error,
        total_bytes=sum(e.size for e in entries) + (len(raw_head) if raw_head is not None else 0),
        objects=len(entries) + (raw_head is not None), other=len(other), other_names=other[:MAX_OTHER_LISTED],
        manifests_read=len(read), seconds=time.perf_counter() - t0, head_error=head_error)


__all__ = ["status", "StreamStatus", "StepInfo", "HeadInfo"]
