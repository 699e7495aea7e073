"""What a local disk's errors mean: a full disk is not a filesystem that cannot link.

The capability probe and every write on a local disk tell these apart
(``LocalStorage``, ``check_create_if_absent``):

- ``ENOSPC`` (no space left), ``EDQUOT`` (the user's quota is used up): the disk is full.
  Retried within the retry budget (``retry.py``): space freed in time is ridden through.
- ``EIO``: the device failed an I/O. Retried the same way, by writing the whole file again
  (after a failed write or fsync the kernel may have dropped the file's pages, so nothing
  already written is trusted).
- ``EROFS``: the filesystem is read-only (mounted so, or remounted so by the kernel after
  errors). Not retried: it does not pass by itself.

Each becomes a :class:`StorageError` naming the path, the condition, the free space of the
filesystem holding it (``os.statvfs``) and what to do. Only a failing ``link()`` (``EPERM``,
``ENOTSUP``/``EOPNOTSUPP``, ``ENOSYS``: a filesystem without hard links) means "cannot create
a file atomically" (:class:`NoHardLinks`).
"""

from __future__ import annotations

import errno
import os

from connectors.core.errors import StorageError
from connectors.core.storage.retry import Retried

#: errno -> what the operator reads
CONDITIONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota of this user is used up",
    errno.EIO: "the disk failed an I/O",
    errno.EROFS: "the filesystem is read-only",
}
#: the conditions a retry can outlast (someone frees space, a device recovers)
RETRIED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})
#: what ``link()`` answers on a filesystem without hard links
NO_LINK = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})

_ADVICE = {
    errno.ENOSPC: "free space on that filesystem (or move the path to a larger one)",
    errno.EDQUOT: "free space or raise the quota of this user (uid {uid}) on that filesystem",
    errno.EIO: "check the device (the kernel log, dmesg, names it) and its health",
    errno.EROFS: "it was mounted read-only, or the kernel remounted it so after errors (see "
                 "dmesg); remount it read-write or use another path",
}


class NoHardLinks(OSError):
    """``link()`` failed on a filesystem that cannot make hard links: create-if-absent is
    impossible there (the only meaning of the probe's "cannot create atomically")."""


class NotRetried(OSError):
    """A disk condition met where trying again could not be trusted (an ``EIO`` in the
    middle of a stream: the file's earlier pages are suspect). Reported, never retried."""


def is_retried(e: BaseException) -> bool:
    """A disk condition a retry can outlast (``ENOSPC``, ``EDQUOT``, ``EIO``)."""
    return isinstance(e, OSError) and not isinstance(e, (NoHardLinks, NotRetried)) \
        and e.errno in RETRIED


def condition(e: BaseException) -> str | None:
    """The disk condition ``e`` reports, or None when it is none of them."""
    if not isinstance(e, OSError) or isinstance(e, NoHardLinks):
        return None
    return CONDITIONS.get(e.errno or 0)


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


def mount_point(path: str) -> str:
    """The mount point of the filesystem holding ``path`` (its nearest existing ancestor)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    try:
        dev = os.stat(path).st_dev
        while path != os.path.dirname(path) and os.stat(os.path.dirname(path)).st_dev == dev:
            path = os.path.dirname(path)
    except OSError:
        pass
    return path


def free_space(path: str) -> str:
    """``"12.0 KiB free of 16.0 MiB on the filesystem mounted at /mnt/x"``, or why not."""
    where = mount_point(path)
    try:
        st = os.statvfs(where)
    except OSError as e:
        return f"its free space is unknown ({e})"
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return f"{_size(free)} free of {_size(total)} on the filesystem mounted at {where}"


def disk_error(e: OSError, url: str, path: str, retried: Retried | None) -> StorageError | None:
    """The error that says what happened to the disk at ``path`` (``url`` in messages), or
    None when ``e`` is not a disk condition."""
    what = condition(e)
    if what is None:
        return None
    code = errno.errorcode.get(e.errno or 0, str(e.errno))
    advice = _ADVICE[e.errno or 0].format(uid=os.getuid() if hasattr(os, "getuid") else "?")
    if retried is not None:
        tail = (f"; {retried}. Nothing half-written is left visible: {advice}, and run it "
                "again (a streaming query restarted from its checkpoint is exact)")
    else:
        tail = f"; not retried. {advice[0].upper()}{advice[1:]}"
    return StorageError(f"local disk at {url}: {what} ({code}: {e.strerror}); "
                        f"{free_space(path)}{tail}")
