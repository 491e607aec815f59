"""Where arcfmt may write a file, and how: the rules every output path follows.

- An output that is the same file as one of the inputs is always refused, ``force`` or not. "Same" is
  by device and inode, so it holds through symbolic and hard links, and for a checkpoint folder given
  as input every file in it (each shard, the index) counts.
- An output that exists is refused unless ``force``. A symbolic link there counts as existing; with
  ``force`` the link itself is replaced, never written through.
- The new content goes to a temporary file beside the destination, created with O_EXCL|O_NOFOLLOW,
  then is fsynced and renamed over it. It keeps the replaced file's mode (and owner where permitted);
  a new file gets the default mode under the umask. Without ``force`` the rename refuses to replace
  a file that appeared meanwhile (renameat2 RENAME_NOREPLACE, or a hard link where that is missing).
- A folder output (``folder=True``, for checkpoint folders) follows the same rules, and one that holds
  an input is refused as well: replacing it would remove that input.
- OS errors name the caller's path (``cannot read|write PATH: reason``, category ``io``), never the
  temporary file.
"""
from __future__ import annotations

import ctypes
import errno
import io
import os
import stat

from .errors import InputError, os_error
from .staging import fsync_dir

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_NOT_SUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.EXDEV,
                  errno.EMLINK}


def _error(code: int, path=None) -> OSError:
    return OSError(code, os.strerror(code), path)


def check_readable(path) -> str:
    """``path`` as a string, or FileAccessError (``cannot read PATH: reason``) if it cannot be reached."""
    p = os.fspath(path)
    try:
        os.stat(p)
    except OSError as exc:
        raise os_error(exc, "read", p) from None
    return p


def _identities(inputs) -> dict[tuple[int, int], str]:
    """(st_dev, st_ino) → input path, for each input and, for a folder, each entry in it."""
    ids: dict[tuple[int, int], str] = {}
    for p in inputs:
        if p is None:
            continue
        p = os.fspath(p)
        try:
            st = os.stat(p)
        except OSError:
            continue  # reading it will say what is wrong
        ids.setdefault((st.st_dev, st.st_ino), p)
        if stat.S_ISDIR(st.st_mode):
            try:
                names = os.listdir(p)
            except OSError:
                continue
            for n in names:
                q = os.path.join(p, n)
                try:
                    s = os.stat(q)
                except OSError:
                    continue
                ids.setdefault((s.st_dev, s.st_ino), q)
    return ids


def check_output(path, inputs=(), force: bool = False, *, folder: bool = False,
                 hint: str = "use --force to replace it") -> str:
    """The path to write ``path`` to, after the checks in the module docstring.

    ``inputs``: the paths the command reads (None entries are skipped; folders count with each file in
    them). Raises InputError (category ``input``) for an existing output without ``force`` (the message
    ends with ``hint``), for an output that is one of the inputs, and for something that is not a
    regular file (``folder``: a folder) or a symbolic link; FileAccessError (``io``) for a folder at a
    file's ``path`` or a missing or unusable parent folder. ``folder``: the output is a folder; one
    that holds an input (or a hard link to one) is refused too, since replacing it would remove it.
    """
    path = os.fspath(path)
    if not path:
        raise InputError("the output path is empty")
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        lst = None
    except OSError as exc:
        raise os_error(exc, "write", path) from None
    if lst is None:
        if not folder and (path.endswith(os.sep) or (os.altsep and path.endswith(os.altsep))):
            raise os_error(_error(errno.EISDIR), "write", path)  # names a folder, and there is none
        parent = os.path.dirname(os.path.abspath(path.rstrip(os.sep) or os.sep))
        try:
            pst = os.stat(parent)
        except OSError as exc:
            raise os_error(exc, "write", path) from None
        if not stat.S_ISDIR(pst.st_mode):
            raise os_error(_error(errno.ENOTDIR), "write", path)
        return path
    ids = _identities(inputs)
    try:
        followed = os.stat(path)
    except OSError:
        followed = None  # a dangling link
    for st in (lst, followed):
        if st is not None and (st.st_dev, st.st_ino) in ids:
            inp = ids[(st.st_dev, st.st_ino)]
            what = "one of the inputs" if inp == path else f"the same file as the input {inp}"
            raise InputError(f"{path} is {what}: refusing to overwrite an input (even with --force)")
    if folder and followed is not None and stat.S_ISDIR(followed.st_mode):
        inside = _input_inside(path, inputs, ids)
        if inside is not None:
            raise InputError(f"{path} holds the input {inside}: refusing to replace it (even with --force)")
    if stat.S_ISLNK(lst.st_mode):
        if not force:
            raise InputError(f"{path} already exists (a symbolic link); {hint} (the link itself: what it "
                             "points to is left alone)")
        return path
    if folder:
        if not stat.S_ISDIR(lst.st_mode):
            raise InputError(f"{path} exists and is not a folder: refusing to replace it")
    elif stat.S_ISDIR(lst.st_mode):
        raise os_error(_error(errno.EISDIR), "write", path)
    elif not stat.S_ISREG(lst.st_mode):
        raise InputError(f"{path} exists and is not a regular file: refusing to replace it")
    if not force:
        raise InputError(f"{path} already exists; {hint}")
    return path


def _input_inside(path: str, inputs, ids: dict):
    """An input at or below the folder ``path`` (by resolved path), or an entry of ``path`` that is
    the same file as an input; else None."""
    root = os.path.realpath(path)
    for p in inputs:
        if p is None:
            continue
        rp = os.path.realpath(os.fspath(p))
        if rp == root or rp.startswith(root.rstrip(os.sep) + os.sep):
            return os.fspath(p)
    try:
        names = os.listdir(path)
    except OSError:
        return None
    for n in names:
        try:
            st = os.stat(os.path.join(path, n))
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in ids:
            return ids[(st.st_dev, st.st_ino)]
    return None


class _OutputFile(io.BufferedWriter):
    """A buffered file whose OS errors name the caller's path, not the temporary file's."""

    def __init__(self, raw, user_path: str):
        super().__init__(raw, buffer_size=1 << 20)
        self.user_path = user_path

    def write(self, b):
        try:
            return super().write(b)
        except OSError as exc:
            raise os_error(exc, "write", self.user_path) from None

    def flush(self):
        try:
            return super().flush()
        except OSError as exc:
            raise os_error(exc, "write", self.user_path) from None


def _keep_owner_and_mode(fd: int, st) -> None:
    try:
        os.fchown(fd, st.st_uid, st.st_gid)  # before the mode: chown clears set-id bits
    except OSError:
        try:
            os.fchown(fd, -1, st.st_gid)
        except OSError:
            pass
    try:
        os.fchmod(fd, stat.S_IMODE(st.st_mode))
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise


def _renameat2():
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    except (OSError, TypeError, AttributeError):
        return None


def _rename_noreplace(tmp: str, path: str) -> None:
    fn = _renameat2()
    if fn is not None:
        if fn(_AT_FDCWD, os.fsencode(tmp), _AT_FDCWD, os.fsencode(path), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in _NOT_SUPPORTED:
            raise _error(err, path)
    try:
        os.link(tmp, path, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NOT_SUPPORTED:
            raise
        if os.path.lexists(path):  # no atomic way on this file system: the last check, then rename
            raise _error(errno.EEXIST, path) from None
        os.rename(tmp, path)
        return
    try:
        os.unlink(tmp)
    except OSError:
        pass


def write_atomic(path: str, tmp: str, fill, *, overwrite: bool = False):
    """``fill(f)`` into the new file ``tmp`` (beside ``path``), then rename it over ``path``; returns what
    ``fill`` returned. ``overwrite``: replace an existing ``path`` (a symbolic link: the link itself),
    keeping a replaced file's mode and owner; without it an existing ``path`` raises InputError, even
    one that appeared while ``fill`` ran. On any failure ``tmp`` is removed and ``path`` is as it was."""
    path = os.fspath(path)
    try:
        lst = os.lstat(path)
    except OSError:
        lst = None
    keep = lst if lst is not None and stat.S_ISREG(lst.st_mode) else None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o666)  # 0o666 under the umask, as open(path, "wb") gives
    except OSError as exc:
        raise os_error(exc, "write", path) from None
    f = None
    try:
        f = _OutputFile(io.FileIO(fd, "w"), path)
        result = fill(f)
        f.flush()
        try:
            if keep is not None:
                _keep_owner_and_mode(fd, keep)
            os.fsync(fd)
            f.close()
            if overwrite:
                os.replace(tmp, path)
            else:
                _rename_noreplace(tmp, path)
        except FileExistsError:
            raise InputError(f"{path} already exists; use --force to replace it") from None
        except OSError as exc:
            raise os_error(exc, "write", path) from None
        fsync_dir(os.path.dirname(os.path.abspath(path)))
        return result
    except BaseException:
        try:
            if f is not None:
                f.close()
            else:
                os.close(fd)
        except (OSError, InputError):
            pass
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


__all__ = ["check_output", "check_readable", "write_atomic"]
