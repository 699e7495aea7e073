"""A command run with a ``/tmp`` of its own, to see exactly what it leaves there (issue 50):
a mount namespace (``unshare -m``, root or CAP_SYS_ADMIN) whose ``/tmp`` is a fresh tmpfs,
listed into a file once the command has ended. Nothing else on the machine writes there, so
whatever the listing names, the command left, however busy the shared ``/tmp`` is. Paths the
command needs must not lie under ``/tmp`` (the tmpfs hides them). Used by the demo test and
scripts/release_check.py. Standard library only."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

_SCRIPT = 'mount -t tmpfs eo-private-tmp /tmp || exit 97; "$@"; rc=$?; ls -A /tmp > "$0"; exit $rc'


def available() -> bool:
    """A mount namespace can be made here."""
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-m", "true"], capture_output=True, check=False).returncode == 0


def wrap(argv: Sequence[str], listing: Path) -> list[str]:
    """``argv`` run with a private ``/tmp``, whose entries go to ``listing`` when it ends
    (the command's exit code is kept; 97: the tmpfs could not be mounted)."""
    if str(listing.resolve()).startswith("/tmp/"):
        raise ValueError(f"{listing}: the listing must not be under /tmp, which is replaced")
    return ["unshare", "-m", "sh", "-c", _SCRIPT, str(listing), *argv]


def left(listing: Path) -> list[str]:
    """What the command left in its ``/tmp``."""
    return listing.read_text().split()
