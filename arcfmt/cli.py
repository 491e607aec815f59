"""The ``arcfmt`` command line: demo, encode, apply, inspect, report, publish, follow.

Exit codes: 0 success; 1 the input was refused (bad, corrupt or wrong-base file: an ArcError; an
output that exists, without --force, or that is one of the inputs; or an operating-system error on a
file: ``arcfmt: error (io): cannot read|write PATH: reason``); 2 usage error; 3 unexpected internal
error (a bug: please report it with --debug output); 130 interrupted (Ctrl-C); 141 standard output
closed by its reader before the command was done (``arcfmt inspect x.arc | head``): no message, the
status a tool killed by SIGPIPE has, so a shell pipeline reads the same as with coreutils.

Conventions (see EPILOG): ``-`` is stdin for ``apply``/``inspect`` DELTA and stdout for ``encode
-o -``; ``-o DIR/`` writes ``DIR/stepNNNN.<ext>``; ``-q`` / ``ARCFMT_QUIET=1`` silence everything on
stderr but errors, ``ARCFMT_NO_PROGRESS=1`` the progress bars; each store retry is one stderr line
(:func:`arcfmt.store.retry.set_notifier`).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

from . import __version__
from .errors import ArcError

EPILOG = """examples:
  arcfmt demo
  arcfmt encode ckpt/step0030 ckpt/step0031 -o step31.arc
  arcfmt encode --keyframe ckpt/step0031 -o key31.arc
  arcfmt apply ckpt/step0030 step31.arc -o ckpt/step0031
  arcfmt apply /models/current step31.arc --in-place
  arcfmt inspect step31.arc --json
  arcfmt report step31.arc --base ckpt/step0030 -o step31.html
  arcfmt publish s3://bucket/run42 --step 17 --shard 3/8 ckpt/step0017/model-00004-of-00008.safetensors
  arcfmt follow s3://bucket/run42 --into /models/run42 [--tensors 'model.layers.*.mlp.*'] [--once|--until STEP]
  arcfmt status s3://bucket/run42 [--json]
  arcfmt prune s3://bucket/run42 --keep-last 50 [--keep-keyframes 2] [--dry-run]

Commands that write a file refuse one that exists unless --force, and always one of their inputs.
'-' is standard input for the DELTA of apply and inspect (a pipe is copied to a private temporary
file in TMPDIR first) and standard output for encode -o - (never a terminal). -o DIR/ writes into
the folder DIR (made if missing), naming the file after its target step: DIR/step0031.arc.

quiet: -q (before or after the command) or ARCFMT_QUIET=1: no progress bars, notes, warnings or
retry lines on stderr, only errors; ARCFMT_NO_PROGRESS=1: no progress bars. Without them, each
retry of a failing store request is one stderr line.

exit codes: 0 ok, 1 input refused (corrupt, truncated, wrong base, an existing output, ...) or an
OS error on a file ("error (io): cannot read|write PATH: reason"), 2 usage, 3 internal error,
130 interrupted (Ctrl-C), 141 stdout closed early by its reader (`arcfmt inspect x.arc | head`:
no message; 128 + SIGPIPE, as for any tool that head stops)
"""


FORCE_HELP = ("replace OUTPUT if it exists (atomically, keeping its mode; a symbolic link is replaced "
              "itself, never written through); an output that is one of the inputs is refused even so")


class UsageError(Exception):
    """Arguments that do not make sense together (exit code 2)."""


def _step_of(path: str | None):
    m = re.search(r"step[_-]?(\d+)", os.path.basename(os.path.normpath(path))) if path else None
    return int(m.group(1)) if m else None


def _progress(total: int | Callable[[], int], desc: str, enabled: bool):
    """``(update, close)`` of a progress bar on stderr (``update`` None when disabled). ``total`` may be
    a function, called at the first update: a total that needs the file's headers is then known
    without reading them ahead of the decoder's own checks (which read each header, then its base)."""
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=None if callable(total) else total, desc=desc, unit="B", unit_scale=True,
               unit_divisor=1024, leave=False, file=sys.stderr)
    if not callable(total):
        return bar.update, bar.close

    def update(n: int) -> None:
        if bar.total is None:
            bar.total = total()
        bar.update(n)
    return update, bar.close


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


# --------------------------------------------------------------------------- shell conventions

MIN_BLOCK_ELEMS = 1024   # the least --block-elems the command line takes (the format allows 1; see --help)
_SPOOL_CHUNK = 1 << 20
_TRUE = ("", "0", "false", "no", "off")


def _env_flag(name: str) -> bool:
    """An environment switch: set to anything but '', 0, false, no or off."""
    return os.environ.get(name, "").strip().lower() not in _TRUE


_TERMINAL_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
_TERMINAL_CONTROLS.update({c: f"\\u{c:04x}" for c in [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                                                      *range(0x2066, 0x206A)]})


def _shown(name: str) -> str:
    """A tensor name as a terminal may print it (SPEC.md §17): control characters (C0, DEL, C1) and
    bidirectional overrides escaped as ``\\xNN`` / ``\\uNNNN``, so a name can neither drive the terminal
    nor reorder the line; a backslash is doubled so that the escapes are unambiguous."""
    return name.replace("\\", "\\\\").translate(_TERMINAL_CONTROLS)


def _warning_line(args):
    """``warnings.showwarning`` for the command line: one ``arcfmt: warning:`` line (none with -q),
    never the source line Python's default format adds."""
    def show(message, category, filename, lineno, file=None, line=None) -> None:
        _note(args, f"warning: {message}")
    return show


def _note(args, text: str) -> None:
    """A line for the user on stderr (a warning, a retry, a hint); none with -q / ARCFMT_QUIET."""
    if not getattr(args, "quiet", False):
        print(f"arcfmt: {text}", file=sys.stderr, flush=True)


def _format_version(text: str) -> tuple[int, int]:
    """``--readers``: a format version ``MAJOR.MINOR`` the writer can serve (a usage error otherwise)."""
    from .layout import MAJOR, MINOR
    from .writer import OLDEST_READERS
    m = re.fullmatch(r"([0-9]{1,5})\.([0-9]{1,5})", text)
    if m is None or not OLDEST_READERS <= (int(m[1]), int(m[2])) <= (MAJOR, MINOR):
        raise argparse.ArgumentTypeError(f"not a format version from {OLDEST_READERS[0]}.{OLDEST_READERS[1]} to "
                                         f"{MAJOR}.{MINOR}: {text!r}")
    return int(m[1]), int(m[2])



def _count_at_least(least: int):
    """An argparse type: an integer of at least ``least`` (else a usage error, exit 2)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes an integer, not {text!r}") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, not {n}")
        return n
    return parse


def _block_elems(text: str) -> int:
    from .layout import MAX_BLOCK_ELEMS

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number of elements, not {text!r}") from None
    if n < MIN_BLOCK_ELEMS:
        raise argparse.ArgumentTypeError(
            f"{n} is below {MIN_BLOCK_ELEMS}: every block carries a record header, a stream table and codec "
            f"framing, so blocks this small encode slowly into a delta that can outgrow the model (the format "
            f"allows 1..{MAX_BLOCK_ELEMS}; arcfmt.encode(..., block_elems=N) takes any of them)")
    if n > MAX_BLOCK_ELEMS:
        raise argparse.ArgumentTypeError(f"{n} is above the format's limit of {MAX_BLOCK_ELEMS} (SPEC.md §14)")
    return n


def _is_folder_path(path: str, inputs=()) -> bool:
    """``-o DIR/`` (a trailing slash) or ``-o DIR`` for a folder that exists: write into that folder.
    Never into a folder that is one of ``inputs`` (a checkpoint folder): that output is refused as
    one of the inputs, as it always was."""
    if not (path.endswith(os.sep) or bool(os.altsep and path.endswith(os.altsep)) or os.path.isdir(path)):
        return False
    for q in inputs:
        try:
            if q is not None and os.path.isdir(q) and os.path.samefile(q, path):
                return False
        except OSError:
            pass
    return True


def _into_folder(path: str, name: str) -> str:
    """``path/name``, making the folder ``path`` (and its parents) if it is missing."""
    from .errors import os_error

    if not os.path.isdir(path):
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise os_error(exc, "write", path) from None
    return os.path.join(path, name)


def _step_file(step: int | None, fallback: str, ext: str) -> str:
    """The name of a file written into a folder: ``step0017.arc`` after its target step, else after
    ``fallback`` (the target's own name, without its extension)."""
    if step is not None:
        return f"step{step:04d}{ext}"
    stem = os.path.basename(os.path.normpath(fallback))
    for old in (".safetensors", ".arc"):
        if stem.endswith(old) and len(stem) > len(old):
            stem = stem[:-len(old)]
    return stem + ext


def _binary_stdout():
    """stdout for binary output (``-o -``); a usage error where it is a terminal."""
    if sys.stdout is None:
        raise UsageError("-o -: there is no standard output")
    if sys.stdout.isatty():
        raise UsageError("refusing to write a binary delta to a terminal: redirect or pipe stdout, or give -o FILE")
    sys.stdout.flush()
    return sys.stdout.buffer


@contextlib.contextmanager
def _open_delta(path: str):
    """The delta file ``path`` opened for reading; ``-``: standard input. A pipe (standard input, a
    FIFO, ``<(...)``) is copied to a private, already-unlinked temporary file first (the reader needs
    random access), checking the free space of its folder (TMPDIR) before every MiB, so the copy is
    bounded by the disk as the file itself is; opening a FIFO never waits for a writer."""
    from .errors import os_error
    from .safetensors_io import open_input

    if path != "-":
        try:
            f, st = open_input(path)
        except OSError as exc:
            raise os_error(exc, "read", path) from None
        with f:
            if stat.S_ISDIR(st.st_mode):
                raise os_error(IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)), "read", path)
            if stat.S_ISREG(st.st_mode):
                yield f
            else:
                with _spooled(f.fileno(), path) as spool:
                    yield spool
        return
    if sys.stdin is None:
        raise UsageError("DELTA is '-' but there is no standard input")
    fd = sys.stdin.fileno()
    if os.isatty(fd):
        raise UsageError("DELTA is '-' (standard input), which is a terminal: pipe or redirect a delta into it")
    if stat.S_ISREG(os.fstat(fd).st_mode):  # `< file.arc`: read it where it is
        with os.fdopen(os.dup(fd), "rb") as f:
            yield f
        return
    with _spooled(fd, "standard input") as spool:
        yield spool


@contextlib.contextmanager
def _spooled(fd: int, what: str):
    """What ``fd`` (a pipe) delivers, in a private temporary file (:func:`_open_delta`)."""
    from .errors import LimitError, os_error

    folder = tempfile.gettempdir()
    try:
        spool = tempfile.TemporaryFile(prefix=".arcfmt-stdin-", dir=folder)
    except OSError as exc:
        raise os_error(exc, "write", folder) from None
    with spool:
        total = 0
        while True:
            try:
                chunk = os.read(fd, _SPOOL_CHUNK)
            except OSError as exc:
                raise os_error(exc, "read", what) from None
            if not chunk:
                break
            try:
                free = shutil.disk_usage(folder).free
                if len(chunk) > free:
                    raise LimitError(f"{what}: more than {total} bytes, and {folder} has {free} bytes free "
                                     f"to hold them (set TMPDIR to a folder with more room, or give a file)")
                spool.write(chunk)
            except OSError as exc:
                raise os_error(exc, "write", folder) from None
            total += len(chunk)
        spool.seek(0)
        yield spool


def _stdout_gone() -> None:
    """After EPIPE on stdout: point stdout at /dev/null, so that Python's own flush at exit does not
    fail again (https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, AttributeError, ValueError):
        pass


def _file_kind(path: str) -> str | None:
    """What ``path`` holds, from its first bytes: 'arcfmt', 'safetensors', 'folder' (of safetensors
    shards), or None (something else, or unreadable: the command's own error says which)."""
    from .layout import MAGIC

    try:
        if os.path.isdir(path):
            return "folder" if any(n.endswith(".safetensors") for n in os.listdir(path)) else None
        if not os.path.isfile(path):
            return None   # a FIFO or a device: opening or reading it could wait, or consume it
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return None
    if head.startswith(MAGIC):
        return "arcfmt"
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 30:
        return "safetensors"
    return None


def _check_apply_order(args) -> None:
    """The hint for the common mistake: BASE and DELTA swapped (or two checkpoints given)."""
    from .errors import InputError

    dk = None if args.delta == "-" else _file_kind(args.delta)
    bk = _file_kind(args.base)
    if dk in ("safetensors", "folder"):
        what = "a safetensors file" if dk == "safetensors" else "a folder of safetensors shards"
        hint = ("swapped arguments? (arcfmt apply BASE DELTA)" if bk == "arcfmt" else
                "the delta comes second (arcfmt apply BASE DELTA); to make one: arcfmt encode BASE TARGET -o D.arc")
        raise InputError(f"DELTA {args.delta} is {what}, not an arcfmt delta — {hint}")
    if bk == "arcfmt":
        raise InputError(f"BASE {args.base} is an arcfmt delta, not a checkpoint — the checkpoint comes first "
                         f"(arcfmt apply BASE DELTA)")


def _already_target(base_path: str, reader) -> bool:
    """Whether the checkpoint at ``base_path`` already holds this delta's target: every tensor of the
    delta there, of its dtype and shape, with its target hash (the delta was applied already)."""
    from .arrays import as_uint
    from .integrity import tensor_hash
    from .safetensors_io import open_checkpoint

    try:
        tensors = open_checkpoint(base_path).stored()
        for name in reader.names:
            th = reader.header(name)
            arr = tensors.get(name)
            if arr is None:
                return False
            dt, shape, u = as_uint(arr)
            if dt is not th.dtype or tuple(shape) != th.shape or tensor_hash(u) != th.target_hash:
                return False
    except (ArcError, OSError, ValueError):
        return False
    return bool(reader.names)


def cmd_encode(args) -> int:
    from .checkpoint import encode_checkpoints
    from .outputs import check_output, check_readable
    from .safetensors_io import open_checkpoint

    if args.keyframe:
        if len(args.paths) != 1:
            raise UsageError("arcfmt encode --keyframe takes one checkpoint: TARGET")
        base, target = None, args.paths[0]
    else:
        if len(args.paths) != 2:
            raise UsageError("arcfmt encode takes BASE TARGET (or --keyframe TARGET)")
        base, target = args.paths
    base_step = args.base_step if args.base_step is not None else _step_of(base)
    target_step = args.target_step if args.target_step is not None else _step_of(target)
    # a keyframe is written once per many steps and read by every new follower: the fast codec trials
    # (as Publisher does), ~30x faster for a few % more bytes; --effort overrides
    effort = args.effort or ("fast" if base is None else "default")
    for p in (target, base):
        if p is not None:
            check_readable(p)
    to_stdout = args.output == "-"
    output = args.output
    out: Any
    if to_stdout:
        out = _binary_stdout()
        shown = "<stdout>"
    else:
        if _is_folder_path(output, [base, target]):
            output = _into_folder(output, _step_file(target_step, target, ".arc"))
        check_output(output, [base, target], args.force)  # before minutes of reading; again when writing
        out = shown = output
    total = open_checkpoint(target).nbytes
    update, close = _progress(total, "encode", args.progress)
    t0 = time.perf_counter()
    try:
        w = encode_checkpoints(base, target, out, base_step=base_step, target_step=target_step,
                               block_elems=args.block_elems, effort=effort, workers=args.workers,
                               keyframe=args.keyframe, progress=update, force=args.force,
                               compact_index=not args.full_index, previous_path=args.previous)
    finally:
        close()
    if to_stdout:
        out.flush()
    dt = time.perf_counter() - t0
    changed = sum(b.changed or 0 for t in w.stats for b in t.blocks)
    size = w.size
    assert size is not None  # encode_checkpoints returns the writer closed
    res = dict(output=output, bytes=size, model_bytes=total, ratio_percent=100 * size / max(total, 1),
               tensors=len(w.stats), changed_elements=changed, seconds=dt, mb_per_s=total / 1e6 / max(dt, 1e-9),
               base_step=base_step, target_step=target_step, effort=effort)
    if size > total:
        why = ("the tensors hardly compress" if base is None else
               "BASE and TARGET share little: is BASE the step before TARGET? (--keyframe needs no base)")
        _note(args, f"warning: the delta ({_fmt_bytes(size)}) is larger than its target's weights "
                    f"({_fmt_bytes(total)}): {why}")
    report = sys.stderr if to_stdout else sys.stdout  # with -o -, stdout holds the delta
    if args.json:
        print(json.dumps(res), file=report)
    elif not (to_stdout and args.quiet):
        print(f"wrote {shown}: {_fmt_bytes(size)} for {_fmt_bytes(total)} of weights "
              f"({res['ratio_percent']:.3f} %), {len(w.stats)} tensors, {changed} changed values, "
              f"{dt:.2f} s ({res['mb_per_s']:.0f} MB/s)", file=report)
    return 0


def cmd_apply(args) -> int:
    from .checkpoint import apply_delta
    from .errors import WrongBaseError
    from .reader import DeltaReader
    from .safetensors_io import open_checkpoint

    if args.in_place == (args.output is not None):
        raise UsageError("arcfmt apply needs exactly one of -o OUT or --in-place")
    _check_apply_order(args)
    t0 = time.perf_counter()
    with _open_delta(args.delta) as f:
        reader = DeltaReader(f, workers=args.workers)
        output = args.output
        if output is not None and _is_folder_path(output, [args.base]) and not open_checkpoint(args.base).is_dir:
            # one file into a folder: named after the step it is at (the base's own name would be wrong)
            output = _into_folder(output, _step_file(reader.target_step, args.base, ".safetensors"))
        update, close = _progress(
            lambda: sum(reader.header(n).size * reader.header(n).dtype.itemsize for n in reader.names),
            "apply", args.progress)
        try:
            res = apply_delta(args.base, reader, output, in_place=args.in_place, workers=args.workers,
                              progress=update, delta_path=None if args.delta == "-" else args.delta,
                              previous_path=args.previous)
        except WrongBaseError as exc:
            if _already_target(args.base, reader):
                at = "this delta's target" if reader.target_step is None else f"step {reader.target_step}"
                raise WrongBaseError(f"BASE {args.base} is already at {at}, the target of this delta "
                                     f"(applied twice?): nothing to do") from exc
            raise
        finally:
            close()
    dt = time.perf_counter() - t0
    out = dict(output=res.path, tensors=res.tensors, changed_tensors=res.changed_tensors,
               bytes_written=res.bytes_written, files=res.files, seconds=dt, verified=True,
               target_step=reader.target_step)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{'updated' if args.in_place else 'wrote'} {res.path}: {res.tensors} tensors "
              f"({res.changed_tensors} changed), {res.files} file(s), verified bit-exact in {dt:.2f} s")
    return 0


def _roles(encoding: str, dtype: str, count: int) -> list[str]:
    """The role of each stream of a block (quotients, signs, ...), as its encoding registers them."""
    from . import encodings
    from .dtypes import from_name

    try:
        names = [r.name for r in encodings.by_name(encoding).stream_roles(from_name(dtype))]
    except (KeyError, ArcError):
        names = []
    return names[:count] + [f"stream {k}" for k in range(len(names), count)]


def _streams_text(streams: dict) -> str:
    return "  ".join(f"{role} {'/'.join(v['codecs'])}:{v['stored']}" for role, v in streams.items())


def _by_role(blocks: list, dtype: str) -> dict:
    """role → stored, decoded and codecs, summed over ``blocks``."""
    per: dict[str, dict[str, Any]] = {}
    for b in blocks:
        for s in b["streams"]:
            p = per.setdefault(s["role"], dict(stored=0, decoded=0, codecs=set()))
            p["stored"] += s["stored"]
            p["decoded"] += s["decoded"]
            p["codecs"].add(s["codec"])
    return {k: dict(stored=v["stored"], decoded=v["decoded"], codecs=sorted(v["codecs"])) for k, v in per.items()}


def cmd_inspect(args) -> int:
    from .reader import DeltaReader

    with _open_delta(args.delta) as f:
        try:
            d = DeltaReader(f).describe()
        except ArcError as exc:
            if args.delta != "-" and exc.category == "bad_magic" and _file_kind(args.delta) == "safetensors":
                raise type(exc)(f"{exc} ({args.delta} is a safetensors file: inspect takes an arcfmt delta)") \
                    from None
            raise
    keyframe = not any(t["needs_base"] for t in d["tensors"])
    d["kind"] = "keyframe" if keyframe else "delta"
    inline = sum(b["inline"] for t in d["tensors"] for b in t["blocks"])
    for t in d["tensors"]:
        for b in t["blocks"]:
            for role, s in zip(_roles(b["encoding"], t["dtype"], len(b["streams"])), b["streams"]):
                s["role"] = role
        t["streams"] = _by_role(t["blocks"], t["dtype"])
        t["block_count"] = len(t["blocks"])
        if not t["needs_base"]:
            t["changed"] = None  # a keyframe tensor: every value is stored, nothing is "changed"
        if not args.blocks:
            del t["blocks"]
    known = [t["changed"] for t in d["tensors"] if t["needs_base"]]
    all_roles: dict[str, int] = {}
    for t in d["tensors"]:
        for role, v in t["streams"].items():
            all_roles[role] = all_roles.get(role, 0) + v["stored"]
    d["totals"] = dict(tensors=len(d["tensors"]), elements=sum(t["elements"] for t in d["tensors"]),
                       changed=None if not known or any(c is None for c in known) else sum(known),
                       bytes=sum(t["bytes"] for t in d["tensors"]), streams=all_roles)
    if args.json:
        print(json.dumps(d, indent=None))
        return 0
    dash = "—"
    base_step = dash if d["base_step"] is None else d["base_step"]
    print(f"arcfmt {d['format_version']} · {d['kind']} · {_fmt_bytes(d['file_bytes'])} · step {base_step} → "
          f"{d['target_step'] if d['target_step'] is not None else dash} · {len(d['tensors'])} tensors · "
          f"index {_fmt_bytes(d['index_bytes'])}" + (" compact" if d["compact_index"] else "")
          + (" · names prefixed" if d["prefixed_names"] else "")
          + (f" · {inline} blocks inline" if d["inline_blocks"] else ""))
    print(f"base digest {dash if keyframe else d['base_digest']}  target digest {d['target_digest']}")
    for t in d["tensors"]:
        t["name"] = _shown(t["name"])
    width = max([len("tensor"), len("total"), *(len(t["name"]) for t in d["tensors"])])
    if args.blocks:
        width = max(width, len("  block 0000000 (inline)"))
    encs = sorted({e for t in d["tensors"] for e in t["encodings"]})
    ew = max([len("encoding"), *(len(",".join(t["encodings"])) for t in d["tensors"])])
    print(f"{'tensor':{width}s} {'dtype':8s} {'shape':>16s} {'changed':>9s} {'bytes':>10s}  {'encoding':{ew}s}  "
          f"streams (role codec:bytes)")

    def changed_text(c, needs_base):
        return dash if not needs_base else "?" if c is None else str(c)

    for t in d["tensors"]:
        shape = "×".join(map(str, t["shape"])) or "()"
        print(f"{t['name']:{width}s} {t['dtype']:8s} {shape:>16s} {changed_text(t['changed'], t['needs_base']):>9s} "
              f"{t['bytes']:>10d}  {','.join(t['encodings']):{ew}s}  {_streams_text(t['streams'])}")
        if args.blocks:
            for k, b in enumerate(t["blocks"]):
                lo = k * t["block_elems"]
                hi = min(t["elements"], lo + t["block_elems"])
                streams = "  ".join(f"{s['role']} {s['codec']}:{s['stored']}" for s in b["streams"])
                ch = changed_text(b["changed"], t["needs_base"])
                label = "  block " + str(k) + (" (inline)" if b["inline"] else "")
                print(f"{label:{width}s} {'':8s} {f'{lo}..{hi}':>16s} {ch:>9s} "
                      f"{b['record_bytes']:>10d}  {b['encoding']:{ew}s}  {streams}")
    tot = d["totals"]
    ch = dash if keyframe else "?" if tot["changed"] is None else str(tot["changed"])
    print(f"{'total':{width}s} {'':8s} {str(tot['elements']) + ' el.':>16s} {ch:>9s} {tot['bytes']:>10d}  "
          f"{','.join(encs):{ew}s}  " + "  ".join(f"{r}:{n}" for r, n in tot["streams"].items()))
    return 0


def cmd_report(args) -> int:
    from .checkpoint import _atomic_file
    from .outputs import check_output, check_readable
    from .report import base_problems, render_html, report_figures

    for p in (args.delta, args.base):
        if p is not None:
            check_readable(p)
    output = args.output
    if _is_folder_path(output, [args.base]):  # -o DIR/: DIR/stepNNNN.html, after the delta's target step
        from .reader import DeltaReader

        with _open_delta(args.delta) as f:
            step = DeltaReader(f).target_step
        output = _into_folder(output, _step_file(step, args.delta, ".html"))
    check_output(output, [args.delta, args.base], args.force)
    fig = report_figures(args.delta, args.base)
    page = render_html(fig).encode("utf-8")
    # a temp file beside it, fsync, rename; OS errors name the output (FileAccessError, category io)
    _atomic_file(output, lambda f: f.write(page), overwrite=args.force)
    # a base that does not match: the page is written (it shows which tensors), the exit status is 1
    bad = base_problems(fig)
    wrong = (f"WRONG BASE: {sum(len(v) for _, v in bad)} of {fig['tensor_count']} tensors do not match "
             f"{args.base} (" + ", ".join(f"{len(v)} {k}" for k, v in bad) + ")") if bad else ""
    if args.json:
        print(json.dumps(fig))
        if wrong:
            print(f"arcfmt: {wrong}", file=sys.stderr)
    else:
        changed = "unknown" if fig["changed"] is None else f"{fig['changed']} changed values"
        print(f"wrote {output}: {fig['kind']} of {_fmt_bytes(fig['file_bytes'])}, {fig['tensor_count']} tensors, "
              f"{changed}, page {_fmt_bytes(len(page))}" + (f"; {wrong}" if wrong else ""))
    return 1 if wrong else 0


def cmd_warm_up(args) -> int:
    import time

    from . import backend
    from .encodings.ctx_delta import warm_up

    backend.announce_first_compile()   # this command's whole point: no warning about it
    if backend.compiled() is None:
        result = dict(backend="numpy", compiled=False, seconds=0.0, cache=None)
    else:
        pending = any(backend.first_compile_pending(k) for k in (backend.ENCODE, backend.DECODE))
        t0 = time.perf_counter()
        warm_up()
        result = dict(backend="numba", compiled=pending, seconds=round(time.perf_counter() - t0, 2),
                      cache=backend.cache_dir())
    if args.json:
        print(json.dumps(result))
    elif result["backend"] == "numpy":
        print("arcfmt: numba is not installed or ARCFMT_JIT=0: the numpy backend needs no compilation")
    else:
        verb = "compiled" if result["compiled"] else "loaded from the cache"
        print(f"arcfmt: the ctx-delta kernels are ready: {verb} in {result['seconds']:.1f} s "
              f"(cache: {result['cache']})")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo
    from .errors import InputError, os_error

    if args.dir is not None:
        # what run_demo writes there: refuse to replace it unless --force, and never follow a link there
        names = ("step0000", "step0001", "step0001.arc", "rebuilt-step0001")
        there = [n for n in names if os.path.lexists(os.path.join(args.dir, n))]
        if there and not args.force:
            raise InputError(f"{args.dir} already holds {', '.join(there)}; use --force to replace them")
        for n in there:  # --force: start afresh (rmtree and unlink remove links, never what they point to)
            p = os.path.join(args.dir, n)
            try:
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.unlink(p)
            except OSError as exc:
                raise os_error(exc, "write", exc.filename or p) from None
    res = run_demo(args.dir, seed=args.seed)
    if args.json:
        print(json.dumps(res))
    else:
        print(res["text"])
    return 0 if res["bit_exact"] else 1


def _storage_options(pairs) -> dict:
    """``KEY=VALUE`` pairs (values parsed as JSON when they are JSON, else kept as strings)."""
    out = {}
    for item in pairs or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option takes KEY=VALUE, not {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _step_in_path(path):
    """The step number in the last path component that names one (``step0017/...`` or ``step17.safetensors``)."""
    for part in reversed(os.path.normpath(path).split(os.sep)):
        m = re.search(r"step[_-]?(\d+)", part)
        if m:
            return int(m.group(1))
    return None


def cmd_publish(args) -> int:
    from .store import Publisher

    m = re.fullmatch(r"(\d+)/(\d+)", args.shard)
    if not m:
        raise UsageError(f"--shard takes RANK/COUNT with RANK counted from 0 (e.g. 3/8), not {args.shard!r}")
    shard, num_shards = int(m.group(1)), int(m.group(2))
    step = args.step if args.step is not None else _step_in_path(args.checkpoint)
    if step is None:
        raise UsageError("give --step (no 'stepNNN' in the checkpoint path)")
    base_step = args.base_step
    if args.base is not None and base_step is None:
        base_step = _step_in_path(args.base)
        if base_step is None:
            raise UsageError("give --base-step (no 'stepNNN' in the --base path)")
    if args.base is None and args.base_step is not None:
        raise UsageError("--base-step needs --base")
    pub = Publisher(args.url, shard=shard, num_shards=num_shards, keyframe_every=args.keyframe_every,
                    sign_key=args.sign_key, stream_id=args.stream_id,
                    storage_options=_storage_options(args.storage_option), effort=args.effort,
                    workers=args.workers, remember=False, state_dir=args.state, writer=args.writer,
                    on_commit=args.on_commit, keep_last=args.keep_last, compact_index=not args.full_index,
                    history=not args.no_history, readers=args.readers)
    res = pub.publish(step, args.checkpoint, base=args.base, base_step=base_step, keyframe=args.keyframe,
                      file_name=args.file_name)
    out = res.as_dict()
    if args.json:
        print(json.dumps(out))
        return 0
    parts = []
    for kind in ("delta", "keyframe"):
        o = out[kind]
        if o is not None:
            frm = f" from step {o['base_step']}" if kind == "delta" else ""
            parts.append(f"{kind}{frm} {_fmt_bytes(o['size'])} ({100 * o['size'] / max(res.model_bytes, 1):.3f} %)")
    c = res.commit
    if c.committed:
        state = f"step committed{' (manifest written here)' if c.made_manifest else ''}, head at step {c.head}"
    elif c.waiting_for_base is not None:
        state = f"waiting for base step {c.waiting_for_base} to be committed"
    else:
        state = f"waiting for shard(s) {', '.join(map(str, c.waiting_for))}"
    why = f" (a keyframe: {res.note})" if res.note else ""
    print(f"published step {step} shard {shard}/{num_shards} ({res.file}): {'; '.join(parts)}{why}; {state}; "
          f"{res.seconds:.2f} s")
    if c.committed and c.head is not None and c.head > step:
        _note(args, f"warning: the head stays at step {c.head}, ahead of step {step}: followers do not see this "
                    f"step (steps are published in order; is a head from another run, or a forged one, in "
                    f"{args.url}? 'arcfmt status' shows it)")
    return 0


def cmd_follow(args) -> int:
    from .store import Follower

    if args.once and args.until is not None:
        raise UsageError("give --once or --until, not both")
    bar = None

    def progress(event):
        nonlocal bar
        if event["event"] == "bytes" and args.progress:
            if bar is None:
                from tqdm import tqdm
                bar = tqdm(desc="download", unit="B", unit_scale=True, unit_divisor=1024, leave=False, file=sys.stderr)
            bar.update(event["bytes"])
        elif event["event"] == "step" and bar is not None:
            bar.close()
            bar = None
        elif event["event"] == "waiting" and not args.quiet:
            print(f"arcfmt: waiting for a stream at {event['url']}", file=sys.stderr, flush=True)

    fol = Follower(args.url, args.into, tensors=args.tensors, storage_options=_storage_options(args.storage_option),
                   trust=args.trust, stream_id=args.stream_id,
                   chunk_size=args.chunk_size, workers=args.workers, progress=progress,
                   missing_wait=args.missing_wait)
    updates = fol.sync() if args.once else fol.follow(until=args.until, interval=args.interval, timeout=args.timeout,
                                                      wait=args.wait, wake_fifo=args.wake_fifo)
    n = 0
    for u in updates:
        n += 1
        d = u.as_dict()
        if args.json:
            print(json.dumps(d), flush=True)
            continue
        frm = "new folder" if u.from_step is None else f"from step {u.from_step}"
        print(f"step {u.step} ({u.kind}, {frm}): {_fmt_bytes(u.bytes_downloaded)} in {u.requests} "
              f"request{'' if u.requests == 1 else 's'} "
              f"({_fmt_bytes(u.bytes_needed)} of records + {_fmt_bytes(u.tail_bytes)} of indexes), "
              f"{len(u.changed)}/{u.tensors} tensors changed, verified{' (whole model)' if u.verified_model else ''} "
              f"in {u.seconds:.2f} s; head {u.head_step}, lag {u.lag_steps} step(s)", flush=True)
    head = fol.head()
    summary = dict(event="done", step=fol.step, head=None if head is None else head.step, applied=n, into=fol.into)
    if args.json:
        print(json.dumps(summary))
    elif n == 0:
        print("nothing committed yet" if head is None else f"{fol.into} is at step {fol.step} (head {head.step})")
    return 0


def cmd_mirror(args) -> int:
    from .store import Mirror

    if args.follow + args.once + (args.until is not None) > 1:
        raise UsageError("give one of --once, --follow and --until")
    options = {}
    for flag, pairs in (("--src-option", args.src_option), ("--dst-option", args.dst_option)):
        for item in pairs or []:
            if not item.partition("=")[0] or "=" not in item:
                raise UsageError(f"{flag} takes KEY=VALUE, not {item!r}")
        options[flag] = _storage_options(pairs)
    mir = Mirror(args.src, args.dst, src_options=options["--src-option"], dst_options=options["--dst-option"],
                 chunk_size=args.chunk_size, missing_wait=args.missing_wait, tmp_dir=args.tmp_dir)
    if args.follow or args.until is not None:
        results = mir.follow(until=args.until, interval=args.interval, timeout=args.timeout, wait=args.wait)
    else:
        results = iter(mir.sync())
    n = 0
    for r in results:
        n += 1
        if args.json:
            print(json.dumps(r.as_dict()), flush=True)
            continue
        have = f", {r.objects_present} already there" if r.objects_present else ""
        head = "head moved" if r.head_moved else "head already past it"
        print(f"step {r.step}: copied {r.objects_copied} data object{'' if r.objects_copied == 1 else 's'}{have}, "
              f"{_fmt_bytes(r.bytes_copied)} written, {_fmt_bytes(r.bytes_read)} read from the source, every hash "
              f"checked{', signature copied' if r.signed else ''}, in {r.seconds:.2f} s; {head}; source head "
              f"{r.source_head}, lag {r.lag_steps} step(s)", flush=True)
    src_head, dst_head = mir.source_head(), mir.head()
    summary = dict(event="done", step=None if dst_head is None else dst_head.step,
                   source_head=None if src_head is None else src_head.step, mirrored=n, dst=args.dst)
    if args.json:
        print(json.dumps(summary))
    elif n == 0:
        print(f"nothing published yet at {args.src}" if src_head is None else
              f"{args.dst} is at step {summary['step']} (source head {summary['source_head']})")
    return 0


def _age(s) -> str:
    if s is None:
        return "-"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.1f}{unit}"
    return f"{s:.0f}s"


def cmd_status(args) -> int:
    from .store import status

    if args.steps < 0:
        raise UsageError("--steps takes a number of steps, 0 for all")
    st = status(args.url, storage_options=_storage_options(args.storage_option), details=args.details)
    if args.json:
        print(json.dumps(st.as_dict()))
        return 0
    h = st.head
    print(f"stream {st.url}")
    if st.head_error is not None:
        print(f"head: unreadable ({st.head_error}); the steps below are from the listing")
    elif h is None:
        print("head: none (nothing committed yet)")
    else:
        print(f"head: step {h.step}, manifest {h.manifest}, keyframe step {h.keyframe_step}, "
              f"moved {_age(h.age_seconds)} ago")
    kf = st.keyframes
    print(f"committed steps: {len(st.steps)}" + (f" ({st.steps[0].step} .. {st.steps[-1].step})" if st.steps else "")
          + f"; keyframes: {len(kf)}" + (f" (latest {kf[-1]})" if kf else ""))
    shown = st.steps if args.steps == 0 else st.steps[-args.steps:]
    if shown:
        print(f"{'step':>10}  {'kind':<8}  {'bytes':>11}  {'shards':>6}  {'writer':<20}  {'age':>7}")
        for s in reversed(shown):
            print(f"{s.step:>10}  {s.kind or '?':<8}  {_fmt_bytes(s.bytes):>11}  {s.shards or '-':>6}  "
                  f"{(s.writer or '-')[:20]:<20}  {_age(s.age_seconds):>7}")
        if len(shown) < len(st.steps):
            print(f"{'':>10}  ... {len(st.steps) - len(shown)} older step(s) (--steps 0 shows all)")
    for s in st.pending:
        if s.blocked:
            print(f"claimed, can never commit: step {s.step}: {s.blocked} ({_fmt_bytes(s.bytes)}, "
                  f"{_age(s.age_seconds)} old); every rank publishes its next step as a keyframe on its own")
            continue
        print(f"claimed, not committed: step {s.step}: descriptors of shard(s) {s.descriptors or 'none'} present, "
              f"waiting for {s.missing or 'the commit'} ({_fmt_bytes(s.bytes)}, {_age(s.age_seconds)} old)")
    if st.new_follower_bytes is not None:
        path = st.new_follower_path
        print(f"a new follower downloads now: {_fmt_bytes(st.new_follower_bytes)} (keyframe of step {path[0][0]} + "
              f"{len(path) - 1} delta(s))")
    elif st.plan_error:
        print(f"a new follower cannot start now: {st.plan_error}")
    print(f"stored: {_fmt_bytes(st.total_bytes)} in {st.objects} objects"
          + (f"; {st.other} other object(s) not of the stream (never touched)" if st.other else "")
          + f"; {st.manifests_read} manifests read in {st.seconds:.2f} s")
    return 0


def cmd_prune(args) -> int:
    from .store import prune

    res = prune(args.url, keep_last=args.keep_last, keep_keyframes=args.keep_keyframes, dry_run=args.dry_run,
                storage_options=_storage_options(args.storage_option))
    if args.json:
        print(json.dumps(res.as_dict()))
        return 0
    if res.head is None:
        print("nothing committed yet: nothing to prune")
        return 0
    verb = "would delete" if res.dry_run else "deleted"
    kept = f"{res.kept[0]}..{res.kept[-1]}" if res.kept else "-"
    print(f"head {res.head}: keeping {len(res.window)} step(s) in the window and the chain back to its keyframe "
          f"({kept}, {len(res.kept)} steps)" + (f", rollback keyframes {res.rollback}" if res.rollback else ""))
    print(f"{verb} {len(res.deleted)} object(s) of {len(res.pruned_steps)} step(s), "
          f"{_fmt_bytes(res.deleted_bytes)}; {_fmt_bytes(res.kept_bytes)} stay"
          + (f"; {res.other} non-stream object(s) left alone" if res.other else "") + f" ({res.seconds:.2f} s)")
    return 0


def cmd_keygen(args) -> int:
    """A new Ed25519 signing key for ``publish --sign-key`` and its public half for ``follow --trust``."""
    from .store.signing import generate_key_files

    kid = generate_key_files(args.out, force=args.force)
    if args.json:
        print(json.dumps(dict(key_id=kid, private_key=args.out, public_key=args.out + ".pub")))
    else:
        print(f"key id {kid}: private key {args.out} (mode 0600; give it to 'publish --sign-key'), "
              f"public key {args.out}.pub (give it to 'follow --trust')")
    return 0


FULL_INDEX_HELP = ("write the index with its offset and checksum columns and every block as its own record, as "
                   "format 1.4 did (SPEC.md §10, §7): files 1.4 and 1.5 decoders read, while a fleet's followers "
                   "are being upgraded")


PROGRESS_HELP = ("show a progress bar on stderr (default: when stderr is a terminal, unless -q, ARCFMT_QUIET=1 "
                 "or ARCFMT_NO_PROGRESS=1)")


def version_text() -> str:
    """What ``arcfmt --version`` prints: the package, the format version of every file it writes
    (SPEC.md part I) and the stream layout version of what it publishes (part II)."""
    from .layout import MAJOR, MINOR
    from .store import STREAM_VERSION

    return (f"arcfmt {__version__} (writes format {MAJOR}.{MINOR} files; "
            f"stream layout {STREAM_VERSION[0]}.{STREAM_VERSION[1]})")


class _VersionAction(argparse.Action):
    """--version, importing the stream layer only when asked."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    from .writer import DEFAULT_BLOCK_ELEMS

    p = argparse.ArgumentParser(prog="arcfmt", description="Lossless weight deltas for RL weight sync (SPEC.md).",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_VersionAction, nargs=0,
                   help="show the package version, the format version of the files it writes and the version "
                        "of the stream layout it publishes, and exit")
    p.add_argument("-q", "--quiet", action="store_true", default=False,
                   help="no progress bars, notes, warnings or retry lines on stderr, only errors (also: "
                        "ARCFMT_QUIET=1; ARCFMT_NO_PROGRESS=1 turns off the progress bars alone)")
    p.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def common(sp):
        sp.add_argument("--json", action="store_true", help="print the figures as one JSON object")
        # SUPPRESS: not given here, the value given before the command stays (arcfmt -q inspect ...)
        sp.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress, notes, warnings or retry lines on stderr (as arcfmt -q)")
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    d = sub.add_parser("demo", help="make a small model pair, encode, apply, verify, print sizes",
                       description="Runs the main job on a built-in example (seeded, ~4 MB).")
    d.add_argument("--dir", help="keep the example files here (default: a temporary folder)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--force", action="store_true", help="replace the demo's files already in --dir")
    common(d)
    d.set_defaults(func=cmd_demo)

    e = sub.add_parser("encode", help="write the delta between two checkpoints",
                       description="BASE/TARGET: a .safetensors file or a folder of shards.",
                       epilog="example: arcfmt encode ckpt/step0030 ckpt/step0031 -o step31.arc",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("paths", nargs="+", metavar="BASE TARGET")
    e.add_argument("-o", "--output", required=True,
                   help="the .arc file to write (atomically); '-': standard output (not a terminal); a folder "
                        "(DIR/, made if missing, or one that exists): DIR/stepNNNN.arc after the target step (no step "
                        "known: after TARGET's name)")
    e.add_argument("--force", action="store_true", help=FORCE_HELP)
    e.add_argument("--keyframe", action="store_true", help="full lossless snapshot of TARGET, needs no base")
    e.add_argument("--base-step", type=int, help="step id of the base (default: from a 'stepNNN' name)")
    e.add_argument("--target-step", type=int, help="step id of the target (default: from a 'stepNNN' name)")
    e.add_argument("--effort", choices=["fast", "default", "max"], default=None,
                   help="codec trials per stream: fast = zstd-3; default = zstd-15 (zstd-9 and xz-6 from 16 KiB); "
                        "max = strongest. Default: default for a delta, fast for a keyframe (--keyframe), "
                        "as 'publish' does: ~30x faster for a few %% more bytes")
    e.add_argument("--block-elems", type=_block_elems, default=DEFAULT_BLOCK_ELEMS,
                   help=f"elements per block, {MIN_BLOCK_ELEMS}..16777216 (default {DEFAULT_BLOCK_ELEMS})")
    e.add_argument("--workers", type=_count_at_least(1), help="encoder threads (default: CPU count)")
    e.add_argument("--full-index", action="store_true", help=FULL_INDEX_HELP)
    e.add_argument("--previous", metavar="PREVIOUS",
                   help="the checkpoint of the step before BASE: signs coded in contexts of each weight's last "
                        "move (format 1.9; 1-15 %% smaller), and 'apply' then needs it too (--previous)")
    e.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help=PROGRESS_HELP)
    common(e)
    e.set_defaults(func=cmd_encode)

    a = sub.add_parser("apply", help="rebuild the target checkpoint from BASE and a delta",
                       epilog="examples:\n  arcfmt apply ckpt/step0030 step31.arc -o ckpt/step0031\n"
                              "  arcfmt apply /models/current step31.arc --in-place",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("base", metavar="BASE")
    a.add_argument("delta", metavar="DELTA", help="the .arc file; '-': read it from standard input")
    a.add_argument("-o", "--output", help="write the target here (must not exist); for a one-file BASE, a folder "
                                          "(DIR/, made if missing, or one that exists): DIR/stepNNNN.safetensors")
    a.add_argument("--in-place", action="store_true", help="replace BASE, crash-safely")
    a.add_argument("--previous", metavar="PREVIOUS",
                   help="the checkpoint of the step before BASE, for a delta encoded with --previous")
    a.add_argument("--workers", type=_count_at_least(1), help="decoder threads (default: CPU count)")
    a.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help=PROGRESS_HELP)
    common(a)
    a.set_defaults(func=cmd_apply)

    i = sub.add_parser("inspect", help="show what a delta file holds, per tensor",
                       epilog="example: arcfmt inspect step31.arc --json")
    i.add_argument("delta", metavar="DELTA", help="the .arc file; '-': read it from standard input")
    i.add_argument("--blocks", action="store_true", help="also one line (and JSON entry) per block")
    common(i)
    i.set_defaults(func=cmd_inspect)

    r = sub.add_parser("report", help="draw a delta as one self-contained HTML page",
                       description="Per tensor: bytes per stream role, changed fraction, codec per stream; the\n"
                                   "file's identity and totals; tensors grouped by name; blocks by changed share.\n"
                                   "One HTML file (no scripts, no external resource), at most 1 MiB for any\n"
                                   "model. With --base, each tensor is also checked against the base, and\n"
                                   "changes in keyframe blocks are counted; a base that does not match is named\n"
                                   "in the summary line and on the page, and the exit status is 1.",
                       epilog="examples:\n  arcfmt report step31.arc -o step31.html\n"
                              "  arcfmt report step31.arc --base ckpt/step0030 -o step31.html --json",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("delta", metavar="DELTA")
    r.add_argument("--base", metavar="BASE", help="the base checkpoint: a .safetensors file or a folder of shards")
    r.add_argument("-o", "--output", required=True, help="the .html file to write (atomically); a folder (DIR/, "
                                                         "made if missing, or one that exists): DIR/stepNNNN.html")
    r.add_argument("--force", action="store_true", help=FORCE_HELP)
    common(r)
    r.set_defaults(func=cmd_report)

    def storage(sp):
        sp.add_argument("-O", "--storage-option", action="append", metavar="KEY=VALUE",
                        help="fsspec storage option (repeatable), e.g. -O endpoint_url=http://127.0.0.1:8333; "
                             "credentials come from the usual botocore / google-auth places")

    pb = sub.add_parser("publish", help="publish one trainer shard's part of a step to a stream",
                        description="Uploads this shard's delta (and a keyframe when due) as immutable objects, "
                                    "claims the shard, and commits the step once every shard is there.",
                        epilog="example: arcfmt publish s3://bucket/run42 --step 17 --shard 3/8 "
                               "ckpt/step0017/model-00004-of-00008.safetensors --state /var/arcfmt",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    pb.add_argument("url", metavar="URL", help="the stream: any fsspec URL (s3://, gs://, a local path, ...)")
    pb.add_argument("checkpoint", metavar="CHECKPOINT_SHARD", help="this shard's safetensors file (or folder)")
    pb.add_argument("--step", type=int, help="step id (default: from a 'stepNNN' in the path)")
    pb.add_argument("--shard", default="0/1", help="RANK/COUNT, RANK counted from 0 (default 0/1)")
    pb.add_argument("--base", help="the previous step's checkpoint shard, to publish a delta from")
    pb.add_argument("--base-step", type=int, help="step id of --base (default: from a 'stepNNN' in its path)")
    pb.add_argument("--state", metavar="DIR", help="keep a copy of what was published here; the next run "
                                                   "publishes its delta from it")
    pb.add_argument("--keyframe", action=argparse.BooleanOptionalAction, default=None,
                    help="force (or suppress) a keyframe; default: every --keyframe-every steps")
    pb.add_argument("--keyframe-every", type=int, default=10, help="keyframe when step %% N == 0 (0: on demand only)")
    pb.add_argument("--file-name", help="the file name followers give this shard (default: the checkpoint's)")
    pb.add_argument("--writer", metavar="ID", help="an id shared by all ranks of this trainer run (e.g. the job id): "
                                                   "a step is never committed from shards of different writers")
    pb.add_argument("--on-commit", metavar="CMD", help="shell command run once for each step this rank commits, "
                                                       "with the step's facts as one JSON line on stdin "
                                                       "(e.g. to notify regions through SNS, Pub/Sub, Redis)")
    pb.add_argument("--keep-last", type=int, metavar="N", help="after each step this rank commits, prune the "
                                                               "stream to its newest N steps (see 'arcfmt prune')")
    pb.add_argument("--sign-key", metavar="FILE", help="sign every step this rank commits with this Ed25519 private "
                                                      "key (from 'arcfmt keygen'; needs the 'cryptography' package)")
    pb.add_argument("--stream-id", metavar="ID", help="with --sign-key: an id of this stream, signed with each step, "
                                                      "so its steps cannot be replayed into another stream")
    pb.add_argument("--effort", choices=["fast", "default", "max"], default="default")
    pb.add_argument("--workers", type=_count_at_least(1), help="encoder threads (default: CPU count)")
    pb.add_argument("--full-index", action="store_true", help=FULL_INDEX_HELP)
    pb.add_argument("--no-history", action="store_true",
                    help="write no delta that needs the previous step (format 1.9: signs coded in contexts of "
                         "each weight's last move, 1-15 %% smaller; followers keep that step's history): for "
                         "followers older than arcfmt 1.9")
    pb.add_argument("--readers", type=_format_version, metavar="1.MINOR",
                    help="the oldest format version the followers read: no block encoding added after it (1.9: "
                         "no ctx-delta-rhp, format 1.10's position classes of the history)")
    storage(pb)
    common(pb)
    pb.set_defaults(func=cmd_publish)

    fo = sub.add_parser("follow", help="keep a local checkpoint folder at a stream's latest step",
                        description="Applies each committed step in order (or jumps through the latest keyframe when "
                                    "that downloads fewer bytes), verifies every tensor and swaps the folder "
                                    "atomically. Runs until interrupted unless --once or --until is given.",
                        epilog="example: arcfmt follow s3://bucket/run42 --into /models/run42 --tensors "
                               "'model.layers.*.mlp.*' --once",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    fo.add_argument("url", metavar="URL")
    fo.add_argument("--into", required=True, metavar="DIR", help="the checkpoint folder to keep up to date")
    fo.add_argument("--tensors", action="append", metavar="PATTERN",
                    help="only tensors matching this shell pattern (repeatable; default: all)")
    fo.add_argument("--once", action="store_true", help="catch up with the current head, then exit")
    fo.add_argument("--until", type=int, metavar="STEP", help="exit once the folder is at STEP or later")
    fo.add_argument("--interval", type=float, default=2.0, help="seconds between head polls (default 2)")
    fo.add_argument("--timeout", type=float, help="exit after this many seconds without a new step")
    fo.add_argument("--wait", action="store_true", help="where there is no stream yet, wait for one (default: "
                                                        "error out, so a typo'd URL is noticed)")
    fo.add_argument("--wake-fifo", metavar="PATH", help="a named pipe (made if missing): any write into it ends the "
                                                       "wait for the next poll at once (push notifications)")
    fo.add_argument("--trust", action="append", metavar="PUBKEY",
                    help="apply only steps signed by this Ed25519 public key file (repeatable: key rotation); "
                         "every used data object is then downloaded whole and checked by SHA-256")
    fo.add_argument("--stream-id", metavar="ID", help="with --trust: require steps signed for this stream id")
    fo.add_argument("--chunk-size", type=int, default=8 << 20, help="largest range request in bytes (default 8 MiB)")
    fo.add_argument("--missing-wait", type=float, default=30.0, metavar="SECONDS",
                    help="how long an object the head names may stay missing (replication lag) before "
                         "not_found; objects pruned meanwhile are re-planned around at once (default 30)")
    fo.add_argument("--workers", type=_count_at_least(1), help="decoder threads (default: CPU count)")
    fo.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="show the bytes of each step as they arrive")
    storage(fo)
    common(fo)
    fo.set_defaults(func=cmd_follow)
    mi = sub.add_parser("mirror", help="republish a stream's committed steps into another bucket (a regional copy)",
                        description="Copies each committed step of SRC into DST in commit order (data objects, "
                                    "descriptors, manifest, signature, then the head), checking every hash a "
                                    "follower checks and decoding nothing; DST is a stream that followers follow "
                                    "unchanged. Reruns copy only what is missing. Catches up and exits unless "
                                    "--follow or --until is given.",
                        epilog="example: arcfmt mirror s3://trainer-bucket/run42 gs://eu-bucket/run42 --follow "
                               "--src-option profile=us --dst-option project=my-project",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    mi.add_argument("src", metavar="SRC", help="the source stream (any fsspec URL)")
    mi.add_argument("dst", metavar="DST", help="the destination stream, in the followers' region")
    mi.add_argument("--once", action="store_true", help="catch up with the source's head, then exit (the default)")
    mi.add_argument("--follow", action="store_true", help="keep polling the source's head and mirror each new step")
    mi.add_argument("--until", type=int, metavar="STEP", help="poll until DST is at STEP or later, then exit")
    mi.add_argument("--wait", action="store_true", help="with --follow/--until: wait for a source with no stream yet "
                                                     "(else that is an error)")
    mi.add_argument("--interval", type=float, default=2.0, help="seconds between source head polls (default 2)")
    mi.add_argument("--timeout", type=float, help="with --follow/--until: exit after this many seconds without a step")
    mi.add_argument("--missing-wait", type=float, default=60.0,
                    help="seconds an object the source's chain names may stay missing (asynchronous replication) "
                         "before not_found (default 60)")
    mi.add_argument("--chunk-size", type=int, default=8 << 20, help="largest range request in bytes (default 8 MiB)")
    mi.add_argument("--tmp-dir", metavar="DIR", help="stage data objects here (default: the system's temp folder)")
    mi.add_argument("--src-option", action="append", metavar="KEY=VALUE", help="fsspec storage option of SRC "
                                                                              "(repeatable), as -O")
    mi.add_argument("--dst-option", action="append", metavar="KEY=VALUE", help="fsspec storage option of DST "
                                                                              "(repeatable), as -O")
    common(mi)
    mi.set_defaults(func=cmd_mirror)

    stt = sub.add_parser("status", help="what a stream holds: head, steps, keyframes, claims, bytes",
                         description="One listing of steps/ and a few reads (the head, the manifests back to the "
                                     "head's latest keyframe, the newest few): fast on thousands of steps.",
                         epilog="example: arcfmt status s3://bucket/run42 --json",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    stt.add_argument("url", metavar="URL")
    stt.add_argument("--steps", type=int, default=20, metavar="N", help="show the newest N committed steps (default "
                                                                        "20; 0: all)")
    stt.add_argument("--details", type=int, default=16, metavar="N",
                     help="read the newest N manifests for writer and kind (default 16)")
    storage(stt)
    common(stt)
    stt.set_defaults(func=cmd_status)

    pr = sub.add_parser("prune", help="delete the steps no follower within the newest N steps needs",
                        description="Keeps the newest N committed steps on the head's chain, the chain back to "
                                    "the keyframe the oldest of them needs, K more keyframe steps, and everything "
                                    "newer; deletes every other step folder below them (manifests first, then "
                                    "descriptors, then data objects). Never touches non-stream names.",
                        epilog="example: arcfmt prune s3://bucket/run42 --keep-last 50 --keep-keyframes 2 --dry-run",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    pr.add_argument("url", metavar="URL")
    pr.add_argument("--keep-last", type=int, required=True, metavar="N", help="committed steps to keep (at least 1)")
    pr.add_argument("--keep-keyframes", type=int, default=0, metavar="K",
                    help="also keep the K newest keyframe steps below those (whole, for rollback; default 0)")
    pr.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
    storage(pr)
    common(pr)
    pr.set_defaults(func=cmd_prune)
    wu = sub.add_parser("warm-up", help="compile the ctx-delta kernels now (once per install), not in a first call",
                        description="Compiles every ctx-delta kernel for every dtype, or loads them from numba's "
                                    "cache, and says which and how long it took. Run it where arcfmt is installed "
                                    "(a container image build, a provisioning step) so that no later command or "
                                    "API call pays the compilation (15-25 s on 2 cores). Without numba, or with "
                                    "ARCFMT_JIT=0, there is nothing to compile.",
                        epilog="example: pip install arcfmt && arcfmt warm-up",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    common(wu)
    wu.set_defaults(func=cmd_warm_up)
    kg = sub.add_parser("keygen", help="make an Ed25519 key pair for signed streams",
                        description="Writes a new private key to PATH (PEM, mode 0600) and its public key to "
                                    "PATH.pub, and prints the key id (SPEC.md S15). The trainer signs with "
                                    "'publish --sign-key PATH'; followers check with 'follow --trust PATH.pub'.",
                        epilog="example: arcfmt keygen --out /secrets/run42.key",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    kg.add_argument("--out", required=True, metavar="PATH", help="the private key file to write")
    kg.add_argument("--force", action="store_true", help="replace PATH and PATH.pub if they exist")
    common(kg)
    kg.set_defaults(func=cmd_keygen)
    return p


def _os_error_text(exc: OSError, args) -> str:
    """``cannot read|write PATH: reason`` for an OSError that no command turned into an ArcError: the
    path the user gave, never a temporary file beside it."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    path = exc.filename
    if path is None:
        if getattr(args, "output", None) == "-" and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EIO,
                                                                  getattr(errno, "EDQUOT", errno.ENOSPC)):
            return f"cannot write standard output: {reason}"
        return reason
    path = os.fsdecode(path) if isinstance(path, bytes) else str(path)
    verb = "access"
    name = os.path.basename(path)
    if name.startswith(".arcfmt-"):  # built beside the user's path: .arcfmt-tmp-PID-HEX-NAME, .arcfmt-old-NAME
        verb = "write"
        parts = name[len(".arcfmt-tmp-"):].split("-", 2)
        if name.startswith(".arcfmt-tmp-") and len(parts) == 3 and parts[2]:
            path = os.path.join(os.path.dirname(path), parts[2])
        elif name.startswith(".arcfmt-old-") and len(name) > len(".arcfmt-old-"):
            path = os.path.join(os.path.dirname(path), name[len(".arcfmt-old-"):])
        else:
            path = os.path.dirname(path) or "."
    writes = [getattr(args, k, None) for k in ("output", "into", "dir", "state")]
    if getattr(args, "in_place", False):
        writes.append(getattr(args, "base", None))
    reads = [getattr(args, k, None) for k in ("paths", "base", "delta", "checkpoint")]
    reads = [q for r in reads for q in (r if isinstance(r, list) else [r])]

    def among(paths):
        """The user's spelling of ``path`` if it is one of ``paths`` (or inside one), else None."""
        full = os.path.abspath(path)
        for q in paths:
            if isinstance(q, str) and q:
                fq = os.path.abspath(q)
                if full == fq:
                    return q
                if full.startswith(fq.rstrip(os.sep) + os.sep):
                    return path
        return None

    for kind, paths in (("write", writes), ("read", reads)):
        user = among(paths)
        if user is not None:
            path = user
            verb = kind if verb == "access" else verb
            break
    return f"cannot {verb} {path}: {reason}"


def _settle_switches(args) -> None:
    """-q / ARCFMT_QUIET, and --progress's default (a terminal on stderr, unless quiet or
    ARCFMT_NO_PROGRESS): an explicit --progress or --no-progress always wins."""
    args.quiet = bool(getattr(args, "quiet", False)) or _env_flag("ARCFMT_QUIET")
    args.debug = bool(getattr(args, "debug", False))
    if hasattr(args, "progress") and args.progress is None:
        args.progress = not args.quiet and not _env_flag("ARCFMT_NO_PROGRESS") and sys.stderr.isatty()


def _retry_line(notice) -> None:
    """One stderr line per retry while a store keeps failing (arcfmt.store.retry's notifier)."""
    print(f"arcfmt: {notice}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    try:   # the package imports what a command needs here, not when the console script loads this module
        return _main(argv)
    except KeyboardInterrupt:   # anywhere in a command: building the parser, importing, running
        print("arcfmt: interrupted", file=sys.stderr)
        return 130


def _main(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _settle_switches(args)
    from .backend import DECODE, ENCODE, announce_first_compile
    from .store import retry

    reaches = {"demo": (ENCODE, DECODE), "encode": (ENCODE,), "publish": (ENCODE,), "apply": (DECODE,),
               "follow": (DECODE,)}   # the kernels each command can reach

    previous = retry.set_notifier(None if args.quiet else _retry_line)
    shown_before = warnings.showwarning
    warnings.showwarning = _warning_line(args)
    try:
        if args.cmd in reaches:   # said once, before the command starts (the API would warn later)
            line = announce_first_compile(reaches[args.cmd])
            if line is not None:
                _note(args, line)
        rc = args.func(args)
        sys.stdout.flush()  # here, so that a reader that went away is seen as one (below)
        return rc
    except BrokenPipeError:
        # stdout's reader left (`arcfmt inspect x.arc | head`): not an error of ours; end quietly with
        # 141 (128 + SIGPIPE), the status of every tool `head` stops early (what the shell reports)
        _stdout_gone()
        return 141
    except ArcError as exc:
        if args.debug:
            raise
        print(f"arcfmt: error ({exc.category}): {exc}", file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"arcfmt: usage error: {exc}", file=sys.stderr)
        return 2
    except SystemExit:
        raise
    except OSError as exc:  # the operating system refused a file: the user's to fix, not a bug
        if args.debug:
            raise
        print(f"arcfmt: error (io): {_os_error_text(exc, args)}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug, not bad input
        if args.debug:
            raise
        print(f"arcfmt: internal error: {type(exc).__name__}: {exc} (run with --debug for the trace)",
              file=sys.stderr)
        return 3
    finally:
        retry.set_notifier(previous)
        warnings.showwarning = shown_before


if __name__ == "__main__":
    sys.exit(main())
