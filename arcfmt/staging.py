"""Stage a new file or folder beside its destination, then swap it in atomically.

At every instant the destination is old or new, never a mix: a crash leaves the old one plus a
staging entry that :func:`recover` removes on the next run. Only entries named by this module's own
patterns are ever removed, symlinks are never followed (a planted one is left alone or unlinked, its
target never touched), and the result keeps the mode and owner of what it replaces.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import os
import re
import shutil
import stat
import uuid

from .errors import InputError, os_error

TMP_TAG = ".arcfmt-tmp-"
OLD_TAG = ".arcfmt-old-"


_NAME_ROOM = 200   # bytes of a destination's name kept in ours: ours add at most 31, a name may have 255


def name_part(base: str) -> str:
    """``base`` as this module's names beside it carry it: whole when it leaves room for the tag, pid
    and random part; else its first bytes, ``~`` and a hash of the whole (the same for every run, so
    that :func:`recover` finds what another run left)."""
    raw = os.fsencode(base)
    if len(raw) <= _NAME_ROOM:
        return base
    return f"{raw[:_NAME_ROOM - 17].decode('utf-8', 'ignore')}~{hashlib.sha256(raw).hexdigest()[:16]}"


def staging_name(dest: str) -> str:
    return f"{TMP_TAG}{os.getpid()}-{uuid.uuid4().hex[:8]}-{name_part(os.path.basename(dest))}"


def _staging_re(base: str):
    return re.compile(rf"{re.escape(TMP_TAG)}(\d+)-[0-9a-f]{{8}}-{re.escape(name_part(base))}\Z")


def umask() -> int:
    """The process umask, read without changing it where Linux says it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


class Owner:
    """The mode and owner a new file or folder takes: those of the one it replaces, else the defaults
    (``0o666``/``0o777`` less the umask, and the creating process's owner)."""

    def __init__(self, st: os.stat_result | None, folder: bool):
        self.mode = stat.S_IMODE(st.st_mode) if st is not None else (0o777 if folder else 0o666) & ~umask()
        self.ids = (st.st_uid, st.st_gid) if st is not None else None

    @classmethod
    def of(cls, path: str, folder: bool) -> Owner:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise os_error(exc, "read", path) from None
        if st is not None and stat.S_ISDIR(st.st_mode) != folder:
            st = None
        return cls(st, folder)

    def apply(self, fd_or_path: int | str) -> None:
        """Set the mode, and the owner where this process may (root, or already the owner)."""
        if isinstance(fd_or_path, int):
            os.fchmod(fd_or_path, self.mode)
            chown = functools.partial(os.fchown, fd_or_path)
        else:
            os.chmod(fd_or_path, self.mode, follow_symlinks=False)
            chown = functools.partial(os.lchown, fd_or_path)
        if self.ids is not None:
            try:
                chown(*self.ids)
            except PermissionError:
                pass  # not root: the files stay ours, as any copy would


class Stage:
    """A file or folder built at a fresh name beside ``dest`` and swapped in by :meth:`commit`.

    ``like``: the existing file or folder whose modes the result keeps (default ``dest``; for a
    folder, each file takes the mode of the file of the same name in it); ``keep_owner``: its owner
    too (when it is what is being replaced).
    """

    def __init__(self, dest: str, *, folder: bool, like: str | None = None, keep_owner: bool = True):
        self.display = os.fspath(dest)   # errors name the user's path
        self.dest = os.path.abspath(dest)
        self.folder = folder
        self.parent = os.path.dirname(self.dest)
        self.path = os.path.join(self.parent, staging_name(self.dest))
        self.keep_owner = keep_owner
        like = like or self.dest
        self.owner = self._owner(Owner.of(like, folder))
        self._like_dir = like if folder and _is_real_dir(like) else None
        self._listed: set[str] | None = None   # the entries carry() saw in the folder it carried from
        if folder:
            try:
                os.mkdir(self.path, 0o700)  # private until it is complete
            except OSError as exc:
                raise os_error(exc, "write", self.display) from None

    def file(self, name: str | None = None) -> str:
        """The staging path of file ``name`` of a folder (or of the file itself)."""
        if not self.folder:
            return self.path
        if name is None or os.path.basename(name) != name or name in ("", ".", ".."):
            raise InputError(f"{name!r} is not a plain file name")
        return os.path.join(self.path, name)

    def owner_of(self, name: str | None = None) -> Owner:
        """Mode and owner for file ``name``: those of the file of that name it replaces, if any."""
        if not self.folder:
            return self.owner
        if self._like_dir is not None:
            assert name is not None, "a file of a folder is named"
            try:
                st = os.lstat(os.path.join(self._like_dir, name))
                if stat.S_ISREG(st.st_mode):
                    return self._owner(Owner(st, False))
            except FileNotFoundError:
                pass
        return Owner(None, False)

    def _owner(self, o: Owner) -> Owner:
        if not self.keep_owner:
            o.ids = None
        return o

    def carry(self, source: str, exclude, *, link: bool) -> list:
        """Bring every entry of folder ``source`` not in ``exclude`` (a model's own files) into the
        stage, sub-folders as a tree of their own, so that a config, a tokenizer or anything a user
        keeps beside the weights is in the new folder *before* the swap: a crash at any instant
        leaves it in whichever folder is the destination. ``link`` (in place): every non-folder entry
        is hard-linked (FIFOs and sockets too: they are the user's); otherwise copied (FIFOs, sockets
        and devices are not copied into a new folder). Refused, before anything changes: a mount
        point inside the folder (it cannot move atomically; a bind mount included), a tree more than
        ``MAX_CARRY_DEPTH`` folders deep, a file that cannot be linked for lack of permission. Every
        folder is walked through descriptors opened without following links, so a folder swapped
        for a link meanwhile is never entered. Errors name the user's path. Returns the top-level
        names carried; entries that appear in ``source`` later are moved over by :meth:`commit`."""
        mounts = _mounts_below(source)
        if mounts:
            raise _mount_refused(mounts[0])
        try:
            sfd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise os_error(exc, "read", source) from None
        try:
            dev = os.fstat(sfd).st_dev
            names = sorted(os.listdir(sfd))
            carried = [n for n in names if n not in exclude
                       and _carry_at(sfd, n, os.path.join(self.path, n), link, dev, os.path.join(source, n), 0)]
        except OSError as exc:
            raise os_error(exc, "read", source) from None
        finally:
            os.close(sfd)
        self._listed = set(names)
        return carried

    def commit(self) -> None:
        """Make the staged result the destination, atomically, then remove the old one."""
        try:
            if self.folder:
                self.owner.apply(self.path)
                fsync_dir(self.path)
                if _is_real_dir(self.dest):
                    exchange_dirs(self.path, self.dest)
                    self._move_late_entries()
                    remove_entry(self.path)  # the old folder, now at our name: nothing in it is only there
                else:
                    os.rename(self.path, self.dest)
            else:
                os.replace(self.path, self.dest)
            fsync_dir(self.parent)
        except OSError as exc:
            raise os_error(exc, "write", self.display) from None

    def _move_late_entries(self) -> None:
        """After the swap: what appeared in the old folder after :meth:`carry` listed it (a log the
        user's job wrote meanwhile) goes to the new folder, where the name is free (best effort)."""
        if self._listed is None:
            return
        try:
            late = [n for n in os.listdir(self.path) if n not in self._listed]
        except OSError:
            return
        for n in late:
            try:
                if not os.path.lexists(os.path.join(self.dest, n)):
                    os.rename(os.path.join(self.path, n), os.path.join(self.dest, n))
            except OSError:
                pass

    def abort(self) -> None:
        remove_entry(self.path)


MAX_CARRY_DEPTH = 64   # folders below a checkpoint folder that carrying it walks into
DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)   # a real folder only


def _mount_refused(path: str) -> InputError:
    return InputError(f"{path} is a mount point inside the folder: it cannot be carried into the new folder "
                      "atomically; unmount it or write the result elsewhere")


def _carry_at(dfd: int, name: str, dst: str, link: bool, dev: int, shown: str, depth: int) -> bool:
    """:meth:`Stage.carry` for entry ``name`` of the folder open at ``dfd`` (``shown``: its path for
    messages), recursively for a folder; False when it is not carried."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(name, dir_fd=dfd), dst)
        elif stat.S_ISDIR(mode):
            if st.st_dev != dev:
                raise _mount_refused(shown)
            if depth >= MAX_CARRY_DEPTH:
                raise InputError(f"{shown} is more than {MAX_CARRY_DEPTH} folders deep: it is not carried into "
                                 "the new folder; move it away or write the result elsewhere")
            sub = os.open(name, DIR_NOFOLLOW, dir_fd=dfd)
            try:
                os.mkdir(dst, 0o700)   # private while it fills; its own mode once complete
                for n in sorted(os.listdir(sub)):
                    _carry_at(sub, n, os.path.join(dst, n), link, dev, os.path.join(shown, n), depth + 1)
            finally:
                os.close(sub)
            _keep_attributes(dst, st)
        elif link and _linked(dfd, name, dst):
            pass
        elif stat.S_ISREG(mode):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dfd)
            with open(fd, "rb") as fsrc, open(dst, "xb") as fdst:
                shutil.copyfileobj(fsrc, fdst, 1 << 20)
            _keep_attributes(dst, st)
        elif not link:
            return False   # a FIFO, socket or device: nothing a new checkpoint folder is given
        elif stat.S_ISFIFO(mode):
            os.mkfifo(dst, stat.S_IMODE(mode))
            _keep_attributes(dst, st)
        else:
            raise InputError(f"{shown} (a socket or device) cannot be linked into the new folder; move it "
                             "away or write the result elsewhere")
    except OSError as exc:
        raise os_error(exc, "carry", shown) from None
    return True


def _linked(dfd: int, name: str, dst: str) -> bool:
    """Hard-link entry ``name`` of the folder at ``dfd`` to ``dst``; False where the file system cannot
    (then it is copied). A link refused for lack of permission is an error: a copy would cut the
    file off from its other names, and it may be large."""
    try:
        os.link(name, dst, src_dir_fd=dfd, follow_symlinks=False)
        return True
    except (PermissionError, FileExistsError):
        raise
    except OSError:
        return False


def _keep_attributes(path: str, st: os.stat_result) -> None:
    """Mode, times and (where this process may) owner of a carried folder or copy."""
    os.chmod(path, stat.S_IMODE(st.st_mode), follow_symlinks=False)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    try:
        os.lchown(path, st.st_uid, st.st_gid)
    except OSError:
        pass   # not root: the copy stays ours, as any copy would


def _mount_points() -> set[str]:
    """Every mount point this process sees (Linux ``/proc/self/mountinfo``, octal escapes undone);
    empty where there is no such file (the ``st_dev`` checks still apply there)."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    unescape = functools.partial(re.sub, rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]))
    return {os.fsdecode(unescape(parts[4])) for parts in (line.split(b" ") for line in lines) if len(parts) > 4}


def _mounts_below(path: str) -> list[str]:
    """The mount points strictly inside folder ``path`` (bind mounts too, which ``st_dev`` misses)."""
    prefix = os.path.realpath(path).rstrip("/") + "/"
    return sorted(m for m in _mount_points() if m.startswith(prefix))


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_entry(path: str) -> None:
    """Remove one entry this module created: a folder's tree (links inside are unlinked, never
    followed), a file, or a link itself."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        _remove_tree(path, st.st_dev)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _remove_tree(path: str, dev: int) -> None:
    """``rm -r`` of a folder this module made, never crossing into a mount (another file system, or a
    bind mount a user placed inside: left, with the folders above it) and never following a link:
    every step is taken relative to a folder already opened without following links. A read-only
    folder of ours is made writable first. Best effort: what cannot go stays."""
    try:
        fd = os.open(path, DIR_NOFOLLOW)
    except OSError:
        return
    _empty_at(fd, dev, path, set(_mounts_below(path)), 0)
    try:
        os.rmdir(path)
    except OSError:
        pass


def _empty_at(fd: int, dev: int, path: str, mounts: set, depth: int) -> None:
    """Remove what folder ``fd`` (at ``path``) holds, then close it, as :func:`_remove_tree` says."""
    try:
        st = os.fstat(fd)
        if st.st_dev != dev or depth > MAX_CARRY_DEPTH + 8:
            return
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
            os.fchmod(fd, 0o700)   # a read-only folder (a carried tokenizer's): its entries can go now
        for name in os.listdir(fd):
            sub = os.path.join(path, name)
            try:
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    if sub in mounts:
                        continue
                    _empty_at(os.open(name, DIR_NOFOLLOW, dir_fd=fd), dev, sub, mounts, depth + 1)
                    os.rmdir(name, dir_fd=fd)
                elif sub not in mounts:
                    os.unlink(name, dir_fd=fd)
            except OSError:
                pass
    except OSError:
        pass
    finally:
        os.close(fd)


def recover(dest: str) -> None:
    """Finish or roll back what a killed run left beside ``dest``: only entries this module names."""
    dest = os.path.abspath(dest)
    parent, base = os.path.split(dest)
    old = os.path.join(parent, f"{OLD_TAG}{name_part(base)}")
    if _is_real_dir(old) and os.lstat(old).st_uid == os.geteuid():
        if not os.path.lexists(dest):
            os.rename(old, dest)  # the swap was cut between its two renames: put the old one back
        else:
            remove_entry(old)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    pattern = _staging_re(base)
    for n in names:
        m = pattern.match(n)
        if m is None:
            continue
        pid = int(m.group(1))
        if pid != os.getpid() and _alive(pid):
            continue  # another live process is building it
        remove_entry(os.path.join(parent, n))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.lru_cache(maxsize=1)
def _renameat2():
    """libc's renameat2, looked up once (find_library runs ldconfig: milliseconds a call)."""
    libc_name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(libc_name, use_errno=True) if libc_name else None
    return getattr(libc, "renameat2", None) if libc else None


def exchange_dirs(a: str, b: str) -> None:
    """Swap two directories atomically (Linux renameat2 RENAME_EXCHANGE), else a recoverable two-step."""
    fn = _renameat2()
    if fn is not None:
        res = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
        if res == 0:
            return
    # Fallback: b → old, a → b. A crash in between leaves only `old`, which recover() puts back.
    old = os.path.join(os.path.dirname(b), f"{OLD_TAG}{name_part(os.path.basename(b))}")
    if os.path.lexists(old):
        raise InputError(f"{old} is in the way of the swap; remove it")
    os.rename(b, old)
    os.rename(a, b)
    os.rename(old, a)


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_private(path: str, flags: int = os.O_RDWR) -> int:
    """Open (creating) a file this module's callers own beside a destination — a lock, a state — never
    through a symlink planted at its name."""
    try:
        return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as exc:
        raise os_error(exc, "write", path) from None
