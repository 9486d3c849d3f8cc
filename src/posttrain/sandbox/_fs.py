"""Writes and reads inside a work directory that never follow a symlink.

Invariant: every path is resolved one component at a time from a descriptor
of the work directory, each component opened with O_NOFOLLOW (directories
also with O_DIRECTORY), so no symlink, name turned into a directory, or file
where a directory is needed can redirect a write or a read outside the work
directory, whoever runs it (root included). What the task left in the way is
reported as a `Conflict` naming the path and the reason; nothing here touches
anything but the work directory. Stdlib only (the fork-server worker imports
this module by file).
"""

from __future__ import annotations

import errno
import os
import stat

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_REASONS = {
    errno.ELOOP: "a symlink is in the way",
    errno.ENOTDIR: "a non-directory is in the way",
    errno.EISDIR: "a directory is in the way",
    errno.EEXIST: "a name is in the way",
    errno.ENOSPC: "the work directory is full",
    errno.EDQUOT: "the work directory is full",
    errno.EROFS: "the path is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENAMETOOLONG: "a name is too long",
}


class Conflict(Exception):
    """What the task left makes a request file impossible to write (or read)."""

    def __init__(self, rel: str, reason: str) -> None:
        super().__init__(f"cannot write {rel!r}: {reason}")
        self.rel, self.reason = rel, reason


def _parts(rel: str) -> list[str]:
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        raise ValueError(f"not a normalised relative path: {rel!r}")
    return parts


def _reason(exc: OSError) -> str:
    return _REASONS.get(exc.errno, os.strerror(exc.errno or 0) or type(exc).__name__)


def _open_parent(top: int, rel: str, parts: list[str], create: bool, uid: int, gid: int) -> int:
    """A descriptor of the directory that holds `rel`'s last component."""
    fd = os.dup(top)
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
                if uid >= 0:
                    os.fchown(nxt, uid, gid)
            except OSError as exc:  # name the symlink (O_DIRECTORY|O_NOFOLLOW says ENOTDIR for one)
                if exc.errno == errno.ENOTDIR and stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, "symlink") from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_file(top: int, rel: str, data: bytes, uid: int = -1, gid: int = -1) -> None:
    """Write `data` at `rel` below the directory `top` (a descriptor).

    Missing directories are made; an existing regular file is replaced (a
    fresh inode, so a hard link to it keeps its old contents); anything else
    in the way (a symlink, a directory, a file where a directory is needed, a
    FIFO) raises Conflict. Mode 0755 for a "#!" script, else 0644."""
    parts = _parts(rel)
    try:
        parent = _open_parent(top, rel, parts, True, uid, gid)
    except OSError as exc:
        raise Conflict(rel, _reason(exc)) from None
    name = parts[-1]
    try:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISLNK(st.st_mode):
                raise Conflict(rel, "a symlink is in the way")
            if stat.S_ISDIR(st.st_mode):
                raise Conflict(rel, "a directory is in the way")
            if not stat.S_ISREG(st.st_mode):
                raise Conflict(rel, "a special file is in the way")
            os.unlink(name, dir_fd=parent)
        mode = 0o755 if data[:2] == b"#!" else 0o644
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent)
        try:
            if uid >= 0:
                os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)  # the umask must not narrow it
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError as exc:
        raise Conflict(rel, _reason(exc)) from None
    finally:
        os.close(parent)


def write_files(top_path: str, files, uid: int = -1, gid: int = -1) -> None:
    """Write every request file below `top_path` (a trusted directory); the
    first Conflict stops the writing and is raised."""
    top = os.open(top_path, _DIR_FLAGS)
    try:
        for rel, data in files.items():
            write_file(top, rel, data.encode() if isinstance(data, str) else data, uid, gid)
    finally:
        os.close(top)


def read_file(top_path: str, rel: str, cap: int) -> bytes | None:
    """The first `cap` bytes of the regular file at `rel` below `top_path`, or
    None when it is missing, not a regular file, or reached through a symlink."""
    try:
        parts = _parts(rel)
    except ValueError:
        return None
    try:
        top = os.open(top_path, _DIR_FLAGS)
    except OSError:
        return None
    try:
        parent = _open_parent(top, rel, parts, False, -1, -1)
    except OSError:
        return None
    finally:
        os.close(top)
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None
    finally:
        os.close(parent)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], cap
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
