"""Operator CLI: ``python -m connectors <command>`` (also installed as ``eo-connectors``).

Commands:

- ``demo``: the end-to-end exactly-once demo (see ``connectors.demo.app``).
- ``wal show PATH [--kind K]``: windows/batches in a write-ahead log, whether each is
  committed, and a restart ``sink reset`` recorded there.
- ``sink status --url URL [--sink-id ID]``: last committed batch (or recorded reset) per JDBC
  sink.
- ``sink reset --sink-id ID (--url URL | --wal-path P | --path P)``: record that the sink's
  next query starts over (a new checkpoint: batch ids from 0), so its batches are accepted
  instead of refused as lower than the last committed one. Run it with the query stopped.
- ``lag --bootstrap B --group G [--topic T]``: per-partition lag of a consumer group (e.g. a
  source's), read without joining the group (``kafka/lookup.py``).
- ``files status PATH``: committed batches and files of an ``eo_files`` output directory.
- ``transactions --bootstrap B --topic T --sink-id ID --writers N [--abort]``: partitions of a
  transactional sink's topic that ``read_committed`` readers are held on, for how long, and
  (``--abort``, after confirmation) the open transactions of ``<ID>-0`` .. ``<ID>-<N-1>``
  aborted.
- ``metrics [--jdbc-url URL] [--wal-path P] [--bootstrap B --group G] [--serve PORT]``: sink
  commits' age and a group's lag, or served to Prometheus (``connectors/cli_metrics.py``).
- ``doctor [--bootstrap B [--topic T] [--group G] [--sink-id ID]] [--path P]``: this
  install (Python, pyspark, confluent-kafka and librdkafka, the C extensions and the Kafka
  sink's produce path, Java and Maven), and when given a cluster's brokers and what they
  serve, the principal's ACLs against docs/security.md, a path's conditional writes
  (``connectors/doctor/``); exit 1 when a check fails.

Every command takes ``--json``. Errors are one line on stderr with exit code 2; passwords in
URLs are redacted in all output. Only ``sink reset`` and ``transactions --abort`` change
anything (``doctor --path`` creates and deletes the sinks' own probe object): read-only
commands never write (docs/design.md), no file, table, directory, topic or consumer-group
offset; no command creates a topic. A command that finds nothing of what it was asked
about (a path or table without our state, a directory without the log asked for, a topic
that does not exist, a group without committed offsets) says what it found and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from connectors import cli_kafka
from connectors.core.errors import ConnectorError
from connectors.core.options import redact_url


def _storage(args: argparse.Namespace, url: str) -> tuple[Any, str]:
    from connectors.state_report import open_storage

    return open_storage(url, getattr(args, "storage", None))


def _emit(args: argparse.Namespace, doc: Any, lines: list[str]) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print("\n".join(lines))


# -- wal show ----------------------------------------------------------------------------------
def wal_show(args: argparse.Namespace) -> int:
    from connectors import state_report as report
    from connectors.core.wal import WriteAheadLog

    storage, path = _storage(args, args.path)
    if not storage.exists(path):
        raise ConnectorError(f"wal show: {args.path!r} does not exist")
    if not storage.is_dir(path):
        raise ConnectorError(f"wal show: {args.path!r} is a file; give the walPath directory")
    root, found = report.find_logs(storage, path)
    if not found:
        raise report.nothing_here(storage, path, args.path)
    kinds = report.select(found, args.kind, args.path)
    reset = report.reset_summary(report.reset_record(storage, root))
    doc: dict[str, Any] = {"path": args.path, "wal_path": storage.url(root), "logs": {},
                           "reset": reset}
    lines = [f"WAL {args.path}" + ("" if root == path else f" (walPath {storage.url(root)})")]
    if reset is not None:
        lines.append(f"  {report.reset_line(reset)}")
    for kind in kinds:
        wal = WriteAheadLog(storage, root, kind)
        seqs, committed_seqs = wal.listing()
        committed = set(committed_seqs)
        entries: list[dict[str, Any]] = []
        # A sink's commit log holds commit markers only (no records): list those too.
        every = sorted(set(seqs) | committed)
        for seq in every[-args.last:] if args.last else every:
            record = wal.get(seq) or {}  # a sink's facts of a batch are in its marker
            info = wal.commit_info(seq) if seq in committed and not record else None
            entries.append({"seq": seq, "committed": seq in committed, "record": record,
                            "commit": info})
        last = committed_seqs[-1] if committed_seqs else None
        note = report.pending_note(kind, entries)
        retained = report.retention_note(kind, every, last)
        doc["logs"][kind] = {"what": report.LOGS.get(kind), "last_committed": last,
                             "entries": entries, "entries_in_log": len(every),
                             "pending_note": note, "retention_note": retained,
                             "keeps": report.kept(kind)}
        shown = (f"; the last {len(entries)} of {len(every)} entries shown"
                 if len(entries) < len(every) else "")
        lines.append(f"  [{kind}] last committed: {last} ({report.LOGS.get(kind, 'a log')})"
                     + shown)
        if retained:
            lines.append(f"    ({retained})")
        for e in entries:
            flag = "committed" if e["committed"] else "PENDING  "
            text = _summarize(e["record"]) if e["record"] else ""
            lines.append(f"    {e['seq']:>8}  {flag}  {text}"
                         f"{report.commit_summary(e['commit'], e['record'])}")
        if not entries:
            lines.append("    (empty: nothing written to this log yet)")
        if note:
            lines.append(f"    ({note})")
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
    from connectors.jdbc import admin

    shown = redact_url(args.url)
    sinks = admin.status(args.url, args.table, args.sink_id)
    lines = [f"JDBC sinks at {shown} (table {args.table})"]
    for s in sinks:
        if s["reset_after"] is not None:
            lines.append(f"  {s['sink_id']}: reset recorded at {s['committed_at']} after batch "
                         f"{s['reset_after']}; nothing committed since (the restarted query's "
                         "batches from 0 are accepted)")
        elif s["batch_id"] < 0:
            lines.append(f"  {s['sink_id']}: nothing committed yet (registered at "
                         f"{s['committed_at']})")
        else:
            lines.append(f"  {s['sink_id']}: last committed batch {s['batch_id']} "
                         f"({s['rows']} rows, at {s['committed_at']})")
    _emit(args, {"url": shown, "table": args.table, "sinks": sinks}, lines)
    return 0


# -- sink reset --------------------------------------------------------------------------------
def sink_reset(args: argparse.Namespace) -> int:
    given = [o for o in ("url", "wal_path", "path") if getattr(args, o)]
    if len(given) != 1:
        raise ConnectorError("sink reset: give exactly one of --url (eo_jdbc), --wal-path "
                             "(eo_kafka sink) or --path (eo_files)")
    if args.url:
        doc = _reset_jdbc(args)
    else:
        doc = _reset_state(args)
    lines = [f"sink {doc['sink_id']!r} at {doc['where']}: reset recorded; the last committed "
             f"batch was {doc['last_committed']}. Start the query with its new checkpoint: "
             "its batch ids from 0 are accepted."]
    _emit(args, doc, lines)
    return 0


def _reset_state(args: argparse.Namespace) -> dict[str, Any]:
    if args.wal_path:
        from connectors.kafka.sink.recovery import sink_state as kafka_state

        family, state = "eo_kafka", kafka_state(*_storage(args, args.wal_path))
        if not args.sink_id:
            raise ConnectorError("sink reset: --sink-id is required with --wal-path")
    else:
        from connectors.files.sink import sink_state as files_state

        family, state = "eo_files", files_state(*_storage(args, args.path))
    if not state.storage.is_dir(state.root):
        raise ConnectorError(f"sink reset: {state.url()} is not a directory")
    owner = state.owner()
    if owner is None and state.last_committed() is None:
        raise ConnectorError(f"sink reset: {state.url()} holds no {family} sink state (no "
                             "owner record, no commits): nothing to reset")
    sink_id = args.sink_id if args.sink_id else (owner.sink_id if owner else None)
    if owner is not None and owner.sink_id != sink_id:
        # The write path's ownership error would say "nothing was written" and advise on
        # sharing a path between two sinks: the operator here named the wrong sink or path.
        raise ConnectorError(
            f"sink reset: {state.url()} belongs to sink_id {owner.sink_id!r} (an {family} "
            f"sink), not {sink_id!r}; nothing was reset. To reset that sink, "
            f"give --sink-id {owner.sink_id}; for sink {sink_id!r}, give its own "
            f"{'--wal-path' if args.wal_path else '--path'}")
    last = state.last_committed()
    record = state.reset(family, sink_id)
    return {"sink_id": sink_id, "where": state.url(), "last_committed": last,
            "batch_offset": record["batch_offset"], "resets": len(record["resets"])}


def _reset_jdbc(args: argparse.Namespace) -> dict[str, Any]:
    from connectors.jdbc import admin

    if not args.sink_id:
        raise ConnectorError("sink reset: --sink-id is required with --url")
    last = admin.reset(args.url, args.sink_id, args.table)
    return {"sink_id": args.sink_id, "where": f"table {args.table!r} at {redact_url(args.url)}",
            "last_committed": last, "batch_offset": 0, "resets": 1}


# -- lag, transactions (connectors/cli_kafka.py) ------------------------------------------------
def lag(args: argparse.Namespace) -> int:
    _emit(args, *cli_kafka.lag(args))
    return 0


def transactions(args: argparse.Namespace) -> int:
    _emit(args, *cli_kafka.transactions(args))
    return 0


# -- files status ------------------------------------------------------------------------------
def files_status(args: argparse.Namespace) -> int:
    from connectors import state_report as report
    from connectors.files.placement import STAGING_DIR, placement_for
    from connectors.files.sink import LOG_DIR, batches_in, committed_paths, sink_state

    storage, root = _storage(args, args.path)
    if not storage.exists(root):
        raise ConnectorError(f"files status: {args.path!r} does not exist")
    if not storage.is_dir(root):
        raise ConnectorError(f"files status: {args.path!r} is a file, not an eo_files output")
    # Before its first commit a sink has left only its attempts: staged or in-place files
    # and their records in _eo_staging. That is worth showing (a kill before batch 0's
    # commit); a path with neither log nor staging was never an eo_files output.
    has_log = storage.exists(storage.join(root, LOG_DIR))
    if not has_log and not storage.exists(storage.join(root, STAGING_DIR)):
        raise ConnectorError(f"files status: {args.path!r} has no {LOG_DIR} and no "
                             f"{STAGING_DIR}: no eo_files sink has written there")
    state = sink_state(storage, root)
    batches = batches_in(state) if has_log else []
    reset = report.reset_summary(state.reset_record())
    shown = batches[-args.last:] if args.last else batches
    lines = [f"eo_files output {args.path}: {len(batches)} committed batches"
             + (f" (the last {len(shown)} shown)" if len(shown) < len(batches) else "")]
    if reset is not None:
        lines.append(f"  {report.reset_line(reset)}")
    for b in shown:
        lines.append(f"  batch {b['batch_id']}: {len(b['files'])} files, {b.get('rows', '?')} rows")
        if args.verbose:
            lines += [f"      {f}" for f in b["files"]]
    total_files = sum(len(b["files"]) for b in batches)
    # What is not (yet) committed: staged files or attempt records, and on object stores
    # data files under their final names that no committed batch lists (the batch in
    # flight, or what a failed attempt left before its batch's cleanup).
    pending = placement_for(storage, root, "").pending()
    uncommitted: list[str] = []
    if not storage.atomic_rename:
        committed = set(committed_paths(storage, root))
        uncommitted = sorted(f for f in storage.walk_files(root)
                             if not f[len(root):].lstrip("/").startswith("_")
                             and f not in committed)
    if pending:
        lines.append(f"  {len(pending)} entries in _eo_staging (attempts in flight, or left "
                     "by failed ones until the next commit's cleanup)")
    if uncommitted:
        lines.append(f"  {len(uncommitted)} data files in no committed batch (the batch in "
                     "flight, or files of failed attempts until the next cleanup)")
        if args.verbose:
            lines += [f"      {storage.url(f)}" for f in uncommitted]
    _emit(args, {"path": args.path, "committed_batches": len(batches), "batches": shown,
                 "files": total_files, "reset": reset,
                 "staging": [storage.url(p) for p in pending],
                 "uncommitted": [storage.url(f) for f in uncommitted]}, lines)
    return 0


# -- doctor ------------------------------------------------------------------------------------
def doctor(args: argparse.Namespace) -> int:
    """What this install can do, and what a cluster, its ACLs or a path serve
    (``connectors/doctor``)."""
    from connectors import doctor as dr

    storage = _storage(args, args.path) if args.path else None
    doc, lines, code = dr.run(args, cli_kafka.kafka_settings(args), storage)
    _emit(args, doc, lines)
    return code


# -- metrics (connectors/cli_metrics.py) --------------------------------------------------------
def metrics(args: argparse.Namespace) -> int:
    from connectors import cli_metrics

    return cli_metrics.run(args, _storage, _emit)


# -- demo --------------------------------------------------------------------------------------
def demo(args: argparse.Namespace) -> int:
    from connectors.demo.app import run_demo

    return run_demo(args)


#: ``--help``'s text: plain words, none of the docstring's reStructuredText markup.
DESCRIPTION = ("Operator CLI of the exactly-once connectors: inspect write-ahead logs, sink "
               "state, consumer lag and open transactions; record a sink reset; check this "
               "install, a cluster and a storage path (doctor); run the demo.")
EPILOG = ("Every command takes --json. Errors are one line on stderr with exit code 2. Only "
          "'sink reset' and 'transactions --abort' change anything, and no command creates a "
          "topic; a command that finds nothing of what it was asked about says what it found "
          "and exits 2. '<command> --help' for each one; docs: README.md, 'Operator CLI'.")


def build_parser(prog: str = "eo-connectors") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EPILOG)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_demo, _add_wal, _add_sink, _add_kafka, _add_files, _add_metrics,
                _add_doctor):
        add(sub)
    return p


def _with_json(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    return sp


def _with_storage(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--storage", action="append", metavar="KEY=VALUE",
                    help="a storage.* option for an object-store path (repeatable), e.g. "
                    "endpoint=http://minio:9000; credentials also come from AWS_*, the "
                    "AWS CLI's ~/.aws files and AWS_PROFILE, "
                    "GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*")


def _add_demo(sub: Any) -> None:
    """``demo``."""
    from connectors.demo.app import add_demo_arguments

    d = _with_json(sub.add_parser("demo", help="end-to-end exactly-once demo with a crash"))
    add_demo_arguments(d)
    d.set_defaults(func=demo)


def _add_wal(sub: Any) -> None:
    """``wal show``."""
    from connectors.state_report import KINDS

    wal = sub.add_parser("wal", help="inspect a write-ahead log").add_subparsers(
        dest="wal_command", required=True)
    w = _with_json(wal.add_parser("show", help="windows and offsets, committed or not"))
    w.add_argument("path", help="the walPath (local, file://, hdfs://, webhdfs://, s3://, gs://, "
                   "abfss://)")
    _with_storage(w)
    w.add_argument("--kind", choices=KINDS, help="only this log: source (eo_kafka source), "
                   "commits (eo_kafka sink), _eo_log (eo_files), or sink (whichever sink log "
                   "is there)")
    w.add_argument("--last", type=int, default=0, help="only the last N entries (default: "
                   "%(default)s, every entry)")
    w.set_defaults(func=wal_show)


def _add_sink(sub: Any) -> None:
    """``sink status`` and ``sink reset``."""
    sink = sub.add_parser("sink", help="sink state: JDBC status, reset of any sink").add_subparsers(
        dest="sink_command", required=True)
    s = _with_json(sink.add_parser("status", help="last committed batch per sink"))
    s.add_argument("--url", required=True, help="SQLAlchemy URL of the target database")
    s.add_argument("--sink-id", help="only this sink")
    s.add_argument("--table", default="eo_sink_commits", help="metadata table name (default: "
                   "%(default)s)")
    s.set_defaults(func=sink_status)
    r = _with_json(sink.add_parser(
        "reset", help="record a restart: the sink's next query (new checkpoint) starts at "
        "batch 0; run it with the query stopped"))
    r.add_argument("--sink-id", help="the sink (required for --url and --wal-path)")
    r.add_argument("--url", help="eo_jdbc: SQLAlchemy URL of the target database")
    r.add_argument("--table", default="eo_sink_commits", help="eo_jdbc: metadata table name "
                   "(default: %(default)s)")
    r.add_argument("--wal-path", help="eo_kafka sink: its walPath")
    r.add_argument("--path", help="eo_files: the output path")
    _with_storage(r)
    r.set_defaults(func=sink_reset)


def _add_kafka(sub: Any) -> None:
    """``lag`` and ``transactions``."""
    lg = _with_json(sub.add_parser("lag", help="per-partition lag of a consumer group"))
    lg.add_argument("--bootstrap", required=True, help="bootstrap servers, host:port[,...]")
    lg.add_argument("--group", required=True, help="the consumer group (kafka.group.id, or "
                    "groupIdPrefix + query of an eo_kafka source)")
    lg.add_argument("--topic", help="only this topic (one that does not exist, or that the "
                    "principal may not DESCRIBE, is then an error, and never created; without "
                    "--topic the broker leaves topics it may not DESCRIBE out)")
    lg.add_argument("--timeout", type=float, default=15.0, help="seconds each lookup may take, "
                    "asked again while a group coordinator loads or moves (default: "
                    "%(default)s)")
    lg.add_argument("--kafka", action="append", metavar="KEY=VALUE",
                    help="a librdkafka setting (repeatable; a kafka. prefix is dropped), e.g. "
                    "security.protocol=SASL_SSL; see docs/security.md")
    lg.add_argument("--kafka-config", metavar="FILE",
                    help="a file of KEY=VALUE librdkafka settings, one a line (# comments): "
                    "keeps kafka.sasl.password off the command line")
    lg.add_argument("--wal-path", metavar="PATH",
                    help="the walPath of the eo_kafka source whose group this is: says how "
                    "much of the lag is windows it planned and has not committed to the group "
                    "yet (the last window of a finished AvailableNow/Once run)")
    _with_storage(lg)
    lg.set_defaults(func=lag)

    tx = _with_json(sub.add_parser(
        "transactions", help="open transactions of a transactional Kafka sink: held "
        "read_committed readers, and aborting them"))
    tx.add_argument("--bootstrap", required=True, help="bootstrap servers, host:port[,...]")
    tx.add_argument("--topic", required=True, help="the sink's target topic")
    tx.add_argument("--sink-id", required=True, help="the sink's sink_id")
    tx.add_argument("--writers", type=int, default=0,
                    help="with --abort: how many writer partitions (Spark tasks per batch) "
                    "the sink has; ids <sink-id>-0 .. -<writers-1> are aborted (default: "
                    "%(default)s; --abort needs it)")
    tx.add_argument("--abort", action="store_true", help="abort their open transactions")
    tx.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    tx.add_argument("--timeout", type=float, default=15.0, help="seconds per broker request "
                    "(default: %(default)s)")
    tx.add_argument("--kafka", action="append", metavar="KEY=VALUE",
                    help="a librdkafka setting (repeatable), see docs/security.md")
    tx.add_argument("--kafka-config", metavar="FILE", help="a file of KEY=VALUE settings")
    tx.set_defaults(func=transactions)


def _add_files(sub: Any) -> None:
    """``files status``."""
    files = sub.add_parser("files", help="eo_files output state").add_subparsers(
        dest="files_command", required=True)
    f = _with_json(files.add_parser("status", help="committed batches and files"))
    f.add_argument("path", help="the eo_files output path (local, file://, hdfs://, "
                   "webhdfs://, s3://, gs://, abfss://)")
    f.add_argument("--last", type=int, default=0, help="only the last N batches (default: "
                   "%(default)s, every batch)")
    f.add_argument("-v", "--verbose", action="store_true", help="list every file")
    _with_storage(f)
    f.set_defaults(func=files_status)


def _add_metrics(sub: Any) -> None:
    """``metrics``."""
    from connectors import cli_metrics

    m = _with_json(sub.add_parser("metrics", help=cli_metrics.HELP))
    cli_metrics.add_arguments(m)
    _with_storage(m)
    m.set_defaults(func=metrics)


def _add_doctor(sub: Any) -> None:
    """``doctor``."""
    from connectors import doctor as dr

    doc = _with_json(sub.add_parser(
        "doctor", help="check this install, and a cluster, ACLs or a storage path when given "
        "(read-only; exit 1 when a check fails)", description="One line per check, ok or what "
        "to do: Python, pyspark, confluent-kafka/librdkafka, the C extensions and the Kafka "
        "sink's produce path, Java and Maven; with --bootstrap each broker's versions and "
        "what it serves; with --topic/--group/--sink-id the principal's ACLs of "
        "docs/security.md's roles; with --path the storage's conditional writes. Creates no "
        "topic and writes nothing but the storage probe the sinks make themselves."))
    dr.add_arguments(doc)
    _with_storage(doc)
    doc.set_defaults(func=doctor)


def main(argv: Sequence[str] | None = None, prog: str = "eo-connectors") -> int:
    args = build_parser(prog).parse_args(argv)
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
