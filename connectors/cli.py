"""Operator CLI: ``python -m connectors <command>`` (also installed as ``eo-connectors``).

Commands:

- ``demo``: the end-to-end exactly-once demo (see ``connectors.demo.app``).
- ``wal show PATH``: windows/batches in a write-ahead log and whether each is committed.
- ``sink status --url URL [--sink-id ID]``: last committed batch per JDBC sink.
- ``lag --bootstrap B --group G``: per-partition lag of a consumer group (e.g. a source's).
- ``files status PATH``: committed batches and files of an ``eo_files`` output directory.

Every command takes ``--json``. Errors are one line on stderr with exit code 2; passwords in
URLs are redacted in all output.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from connectors.core.errors import ConnectorError
from connectors.core.options import redact_url


def _emit(args: argparse.Namespace, doc: Any, lines: list[str]) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print("\n".join(lines))


# -- wal show ----------------------------------------------------------------------------------
def wal_show(args: argparse.Namespace) -> int:
    from connectors.core.storage import storage_for
    from connectors.core.wal import WriteAheadLog

    storage, root = storage_for(args.path)
    if not storage.exists(root):
        raise ConnectorError(f"wal show: {args.path!r} does not exist")
    kinds = [args.kind] if args.kind else [
        k for k in storage.list(root) if storage.is_dir(storage.join(root, k))
    ]
    doc: dict[str, Any] = {"path": args.path, "logs": {}}
    lines = [f"WAL {args.path}"]
    for kind in kinds:
        wal = WriteAheadLog(storage, root, kind)
        committed = set(wal.committed_seqs())
        entries: list[dict[str, Any]] = []
        for seq in wal.seqs()[-args.last:] if args.last else wal.seqs():
            record = wal.get(seq) or {}
            entries.append({"seq": seq, "committed": seq in committed, "record": record})
        doc["logs"][kind] = {"last_committed": wal.last_committed(), "entries": entries}
        lines.append(f"  [{kind}] last committed: {wal.last_committed()}")
        for e in entries:
            flag = "committed" if e["committed"] else "PENDING  "
            lines.append(f"    {e['seq']:>8}  {flag}  {_summarize(e['record'])}")
        if not entries:
            lines.append("    (empty)")
    _emit(args, doc, lines)
    return 0


def _summarize(record: dict[str, Any]) -> str:
    start, end = record.get("start"), record.get("end")
    if isinstance(start, dict) and isinstance(end, dict):
        parts = []
        for topic, parts_end in sorted(end.items()):
            if not isinstance(parts_end, dict):
                continue
            s = start.get(topic, {}) if isinstance(start.get(topic), dict) else {}
            for p, e in sorted(parts_end.items(), key=lambda kv: str(kv[0])):
                parts.append(f"{topic}[{p}] {s.get(p, '?')}..{e}")
        return ", ".join(parts) if parts else json.dumps(record, sort_keys=True)[:200]
    return json.dumps(record, sort_keys=True)[:200]


# -- sink status -------------------------------------------------------------------------------
def sink_status(args: argparse.Namespace) -> int:
    import sqlalchemy as sa

    shown = redact_url(args.url)
    try:
        engine = sa.create_engine(args.url)
    except Exception as e:
        raise ConnectorError(f"sink status: cannot use URL {shown}: {type(e).__name__}") from None
    table = sa.table(args.table, sa.column("sink_id"), sa.column("batch_id"),
                     sa.column("rows"), sa.column("committed_at"))
    query = sa.select(table.c.sink_id, table.c.batch_id, table.c.rows, table.c.committed_at)
    if args.sink_id:
        query = query.where(table.c.sink_id == args.sink_id)
    try:
        with engine.connect() as conn:
            rows = conn.execute(query.order_by(table.c.sink_id)).all()
    except Exception as e:
        raise ConnectorError(
            f"sink status: cannot read {args.table!r} at {shown}: "
            f"{redact_url(str(e).splitlines()[0])}"
        ) from None
    finally:
        engine.dispose()
    sinks = [{"sink_id": r[0], "batch_id": r[1], "rows": r[2], "committed_at": r[3]}
             for r in rows]
    lines = [f"JDBC sinks at {shown} (table {args.table})"]
    lines += [f"  {s['sink_id']}: last committed batch {s['batch_id']} "
              f"({s['rows']} rows, at {s['committed_at']})" for s in sinks]
    if not sinks:
        which = f" for sink {args.sink_id!r}" if args.sink_id else ""
        lines.append("  no committed batches" + which)
    _emit(args, {"url": shown, "table": args.table, "sinks": sinks}, lines)
    return 0


# -- lag ---------------------------------------------------------------------------------------
def lag(args: argparse.Namespace) -> int:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    try:
        futures = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(args.group)], request_timeout=args.timeout
        )
        result = futures[args.group].result(args.timeout)
    except Exception as e:
        raise ConnectorError(
            f"lag: cannot read committed offsets of group {args.group!r} from "
            f"{args.bootstrap}: {e}"
        ) from None
    committed = [tp for tp in result.topic_partitions if tp.error is None and tp.offset >= 0]
    if args.topic:
        committed = [tp for tp in committed if tp.topic == args.topic]
    ends = watermarks(args.bootstrap, [TopicPartition(tp.topic, tp.partition) for tp in committed],
                      timeout=args.timeout)
    partitions = []
    for tp in sorted(committed, key=lambda t: (t.topic, t.partition)):
        end = ends.get((tp.topic, tp.partition))
        partitions.append({
            "topic": tp.topic, "partition": tp.partition, "committed": tp.offset,
            "end": end, "lag": None if end is None else max(0, end - tp.offset),
        })
    total = sum(p["lag"] or 0 for p in partitions)
    lines = [f"group {args.group} @ {args.bootstrap}: total lag {total}"]
    lines += [f"  {p['topic']}[{p['partition']}] committed {p['committed']} end {p['end']} "
              f"lag {p['lag']}" for p in partitions]
    if not partitions:
        lines.append("  no committed offsets")
    _emit(args, {"group": args.group, "total_lag": total, "partitions": partitions}, lines)
    return 0


def watermarks(bootstrap: str, partitions: list[Any], timeout: float) -> dict[tuple[str, int], int]:
    """High watermark per (topic, partition). On a real Kafka this is the log end offset."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "eo-connectors-cli-lag",
                         "enable.auto.commit": False})
    try:
        return {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=timeout)[1]
                for tp in partitions}
    finally:
        consumer.close()


# -- files status ------------------------------------------------------------------------------
def files_status(args: argparse.Namespace) -> int:
    from connectors.files.sink import committed_batches

    batches = committed_batches(args.path)
    lines = [f"eo_files output {args.path}: {len(batches)} committed batches"]
    for b in batches[-args.last:] if args.last else batches:
        lines.append(f"  batch {b['batch_id']}: {len(b['files'])} files, {b.get('rows', '?')} rows")
        if args.verbose:
            lines += [f"      {f}" for f in b["files"]]
    total_files = sum(len(b["files"]) for b in batches)
    _emit(args, {"path": args.path, "batches": batches, "files": total_files}, lines)
    return 0


# -- demo --------------------------------------------------------------------------------------
def demo(args: argparse.Namespace) -> int:
    from connectors.demo.app import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m connectors", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    def with_json(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        return sp

    from connectors.demo.app import add_demo_arguments

    d = with_json(sub.add_parser("demo", help="end-to-end exactly-once demo with a crash"))
    add_demo_arguments(d)
    d.set_defaults(func=demo)

    wal = sub.add_parser("wal", help="inspect a write-ahead log").add_subparsers(
        dest="wal_command", required=True)
    w = with_json(wal.add_parser("show", help="windows and offsets, committed or not"))
    w.add_argument("path", help="the walPath (local, file://, hdfs://, webhdfs://)")
    w.add_argument("--kind", help="only this log (e.g. source, sink)")
    w.add_argument("--last", type=int, default=0, help="only the last N entries")
    w.set_defaults(func=wal_show)

    sink = sub.add_parser("sink", help="JDBC sink state").add_subparsers(
        dest="sink_command", required=True)
    s = with_json(sink.add_parser("status", help="last committed batch per sink"))
    s.add_argument("--url", required=True, help="SQLAlchemy URL of the target database")
    s.add_argument("--sink-id", help="only this sink")
    s.add_argument("--table", default="eo_sink_commits", help="metadata table name")
    s.set_defaults(func=sink_status)

    lg = with_json(sub.add_parser("lag", help="per-partition lag of a consumer group"))
    lg.add_argument("--bootstrap", required=True)
    lg.add_argument("--group", required=True)
    lg.add_argument("--topic", help="only this topic")
    lg.add_argument("--timeout", type=float, default=15.0)
    lg.set_defaults(func=lag)

    files = sub.add_parser("files", help="eo_files output state").add_subparsers(
        dest="files_command", required=True)
    f = with_json(files.add_parser("status", help="committed batches and files"))
    f.add_argument("path")
    f.add_argument("--last", type=int, default=0, help="only the last N batches")
    f.add_argument("-v", "--verbose", action="store_true", help="list every file")
    f.set_defaults(func=files_status)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except ConnectorError as e:
        print(f"error: {redact_url(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
