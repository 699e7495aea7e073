"""A WAL writer for random-kill tests: append and commit records ``0..count-1`` under
``<wal>/source``, resuming after the last committed one, so that it can be SIGKILLed at any
moment and started again. Record ``seq`` is ``{"seq": seq, "pad": ...}`` (240 KB, so that a
kill often lands inside a write). Prints ``WAL DONE`` at the end."""

from __future__ import annotations

import argparse
import sys

from connectors.core.wal import WriteAheadLog


def record(seq: int) -> dict[str, object]:
    return {"seq": seq, "pad": f"{seq:06d}" * 40_000}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--wal", required=True)
    p.add_argument("--count", type=int, required=True)
    args = p.parse_args(argv)
    wal = WriteAheadLog.open(args.wal, "source")
    last = wal.last_committed()
    for seq in range(0 if last is None else last + 1, args.count):
        wal.append(seq, record(seq))  # False (and no write) when a killed run wrote it
        wal.commit(seq, {"seq": seq})
    print("WAL DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
