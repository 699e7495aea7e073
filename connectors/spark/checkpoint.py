"""A Spark checkpoint whose driver died while it wrote its first batch's offsets.

Spark writes each entry of a checkpoint's offset and commit logs as a hidden temporary file
(``offsets/.0.<uuid>.tmp``, with its ``.crc``) renamed into place. A driver killed between
the two leaves the temporary file and no numbered entry. Since Spark 4.1 (SPARK-53103,
``spark.sql.streaming.verifyCheckpointDirectoryEmptyOnStart``, on by default) a query that
finds no entry checks that ``offsets`` and ``commits`` are empty, so the restart fails with
``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY ... should be empty on batch 0``, and fails again
on every restart after it.

Nothing of that batch was committed anywhere: Spark had not recorded its offsets, and the
sinks commit a batch only after Spark planned it. Removing the leftovers lets the query start
at batch 0 again, which the ``eo_kafka`` source plans from its ``walPath`` exactly as before.
:func:`clear_unfinished_first_batch` does that and nothing else: it refuses a checkpoint
that holds any numbered entry, and removes only hidden files (docs/deploying.md, "Spark's own
checkpoint").
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

#: The two logs Spark 4.1+ requires empty when a query starts at batch 0.
LOGS = ("offsets", "commits")


def unfinished_first_batch(checkpoint: str) -> list[str]:
    """The leftover files that would stop ``checkpoint`` from starting at batch 0: hidden
    files in its offset and commit logs while neither log holds a numbered entry. Empty when
    the checkpoint is new, is past its first batch, or was never started."""
    root = _local(checkpoint)
    found: list[str] = []
    for log in LOGS:
        where = os.path.join(root, log)
        try:
            names = os.listdir(where)
        except FileNotFoundError:
            continue
        if any(n.isdigit() for n in names):
            return []
        found += [os.path.join(where, n) for n in sorted(names) if n.startswith(".")]
    return found


def clear_unfinished_first_batch(checkpoint: str) -> list[str]:
    """Remove what :func:`unfinished_first_batch` finds; returns the paths removed."""
    leftovers = unfinished_first_batch(checkpoint)
    for path in leftovers:
        os.remove(path)
    return leftovers


def _local(checkpoint: str) -> str:
    url = urlparse(checkpoint)
    if url.scheme in ("", "file"):
        return url.path if url.scheme else checkpoint
    # Named without any user or password the URL may carry.
    where = f"{url.scheme}://{url.hostname or ''}{f':{url.port}' if url.port else ''}{url.path}"
    raise ValueError(
        f"checkpoint {where!r}: only a local path or a file: URL can be cleared here; "
        f"on {url.scheme}: remove the hidden files in its offsets/ and commits/ directories "
        f"with that store's own tools, if neither holds a numbered entry")
