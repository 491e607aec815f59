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
        self._move_after: list[str] = []
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
        stage — hard links when ``link`` (in place), copies otherwise — so that a config, a tokenizer
        or any file a user keeps beside the weights survives the swap. Sub-folders are moved over
        after the swap (:meth:`commit`) when linking, copied otherwise. Returns the names carried."""
        carried = []
        with os.scandir(source) as it:
            entries = [e for e in it if e.name not in exclude and not e.name.startswith((TMP_TAG, OLD_TAG))]
        for e in entries:
            src, dst = os.path.join(source, e.name), os.path.join(self.path, e.name)
            if e.is_symlink():
                os.symlink(os.readlink(src), dst)
            elif e.is_dir(follow_symlinks=False):
                if link:
                    self._move_after.append(e.name)
                    continue
                shutil.copytree(src, dst, symlinks=True)
            elif e.is_file(follow_symlinks=False):
                if link:
                    try:
                        os.link(src, dst, follow_symlinks=False)
                        carried.append(e.name)
                        continue
                    except OSError:
                        pass
                shutil.copy2(src, dst, follow_symlinks=False)
            else:
                continue  # a FIFO, socket or device is nothing a checkpoint carries
            carried.append(e.name)
        return carried

    def commit(self) -> None:
        """Make the staged result the destination, atomically, then remove the old one."""
        try:
            if self.folder:
                self.owner.apply(self.path)
                fsync_dir(self.path)
                if _is_real_dir(self.dest):
                    exchange_dirs(self.path, self.dest)
                    for name in self._move_after:
                        try:
                            os.rename(os.path.join(self.path, name), os.path.join(self.dest, name))
                        except OSError:
                            pass  # left with the old folder only if the new one gained that name
                    shutil.rmtree(self.path, ignore_errors=True)  # the old folder, now at our name
                else:
                    os.rename(self.path, self.dest)
            else:
                os.replace(self.path, self.dest)
            fsync_dir(self.parent)
        except OSError as exc:
            raise os_error(exc, "write", self.display) from None

    def abort(self) -> None:
        remove_entry(self.path)


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
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def recover(dest: str) -> None:
    """Finish or roll back what a killed run left beside ``dest``: only entries this module names."""
    dest = os.path.abspath(dest)
    parent, base = os.path.split(dest)
    old = os.path.join(parent, f"{OLD_TAG}{base}")
    if _is_real_dir(old) and os.lstat(old).st_uid == os.geteuid():
        if not os.path.lexists(dest):
            os.rename(old, dest)  # the swap was cut between its two renames: put the old one back
        else:
            shutil.rmtree(old, ignore_errors=True)
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
