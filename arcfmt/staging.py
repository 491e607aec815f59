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
import os
import re
import shutil
import stat
import uuid

from .errors import InputError, os_error

TMP_TAG = ".arcfmt-tmp-"
OLD_TAG = ".arcfmt-old-"


def staging_name(dest: str) -> str:
    return f"{TMP_TAG}{os.getpid()}-{uuid.uuid4().hex[:8]}-{os.path.basename(dest)}"


def _staging_re(base: str):
    return re.compile(rf"{re.escape(TMP_TAG)}(\d+)-[0-9a-f]{{8}}-{re.escape(base)}\Z")


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
        is hard-linked (FIFOs and sockets too: they are the user's), copied only where a link cannot
        be made; otherwise copied (FIFOs, sockets and devices are not copied into a new folder).
        A sub-folder on another file system (a mount point) is refused: it cannot move atomically.
        Errors name the user's path. Returns the top-level names carried."""
        carried = []
        try:
            dev = os.lstat(source).st_dev
            with os.scandir(source) as it:
                names = sorted(e.name for e in it
                               if e.name not in exclude and not e.name.startswith((TMP_TAG, OLD_TAG)))
        except OSError as exc:
            raise os_error(exc, "read", source) from None
        for name in names:
            if _carry_entry(os.path.join(source, name), os.path.join(self.path, name), link, dev):
                carried.append(name)
        return carried

    def commit(self) -> None:
        """Make the staged result the destination, atomically, then remove the old one."""
        try:
            if self.folder:
                self.owner.apply(self.path)
                fsync_dir(self.path)
                if _is_real_dir(self.dest):
                    exchange_dirs(self.path, self.dest)
                    remove_entry(self.path)  # the old folder, now at our name: nothing in it is only there
                else:
                    os.rename(self.path, self.dest)
            else:
                os.replace(self.path, self.dest)
            fsync_dir(self.parent)
        except OSError as exc:
            raise os_error(exc, "write", self.display) from None

    def abort(self) -> None:
        remove_entry(self.path)


def _carry_entry(src: str, dst: str, link: bool, dev: int) -> bool:
    """:meth:`Stage.carry` for one entry (recursively for a folder); False when it is not carried."""
    try:
        st = os.lstat(src)
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISDIR(mode):
            if st.st_dev != dev:
                raise InputError(f"{src} is a mount point (another file system): it cannot be carried "
                                 "into the new folder atomically; unmount it or write the result elsewhere")
            os.mkdir(dst, 0o700)   # private while it fills; its own mode once complete
            for name in sorted(os.listdir(src)):
                _carry_entry(os.path.join(src, name), os.path.join(dst, name), link, dev)
            shutil.copystat(src, dst, follow_symlinks=False)
            _keep_owner(dst, st)
        elif link and _try_link(src, dst):
            pass
        elif stat.S_ISREG(mode):
            shutil.copy2(src, dst, follow_symlinks=False)
            _keep_owner(dst, st)
        elif not link:
            return False   # a FIFO, socket or device: nothing a new checkpoint folder is given
        elif stat.S_ISFIFO(mode):
            os.mkfifo(dst, stat.S_IMODE(mode))
            _keep_owner(dst, st)
        else:
            raise InputError(f"{src} (a socket or device) cannot be linked into the new folder; move it "
                             "away or write the result elsewhere")
    except OSError as exc:
        raise os_error(exc, "carry", src) from None
    return True


def _try_link(src: str, dst: str) -> bool:
    try:
        os.link(src, dst, follow_symlinks=False)
        return True
    except OSError:
        return False   # another file system, a file system without links, a protected link


def _keep_owner(path: str, st: os.stat_result) -> None:
    try:
        os.lchown(path, st.st_uid, st.st_gid)
    except OSError:
        pass   # not root: the copy stays ours, as any copy would


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
    """``rm -r`` of a folder this module made, never crossing into another file system (a mount a
    user placed inside is left, with the folders above it) and never following a link: every step
    is taken relative to a folder already opened without following links. Best effort."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    _empty_at(fd, dev)
    try:
        os.rmdir(path)
    except OSError:
        pass


def _empty_at(fd: int, dev: int) -> None:
    """Remove what folder ``fd`` holds (then close it), as :func:`_remove_tree` says."""
    try:
        if os.fstat(fd).st_dev != dev:
            return
        for name in os.listdir(fd):
            try:
                if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                    _empty_at(os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd), dev)
                    os.rmdir(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)


def recover(dest: str) -> None:
    """Finish or roll back what a killed run left beside ``dest``: only entries this module names."""
    dest = os.path.abspath(dest)
    parent, base = os.path.split(dest)
    old = os.path.join(parent, f"{OLD_TAG}{base}")
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
    old = os.path.join(os.path.dirname(b), f"{OLD_TAG}{os.path.basename(b)}")
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
