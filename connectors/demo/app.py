"""``python -m connectors demo``: an end-to-end exactly-once demo with real crashes.

1. Start a local Apache Kafka broker (``connectors.demo.services``), or use ``--bootstrap``.
2. Produce lines of words to an input topic, with a progress bar; remember the true counts.
3. Run the pipeline (``connectors.demo.pipeline``) in a child process:
   ``eo_kafka`` -> word count per micro-batch -> ``eo_jdbc`` (accumulate), ``eo_kafka``
   (per-batch counts to an output topic) and ``eo_files`` (per-batch counts as parquet).
4. SIGKILL the child's whole process group at a random moment mid-stream (``--kills N``
   times), restart it from its checkpoint, and let it finish.
5. Verify every sink against the ground truth and print a report; exit 1 on any mismatch.

``--naive-jdbc`` swaps the JDBC sink for a plain accumulate without the exactly-once
protection (test-only), and ``--crash-at`` kills at a named failpoint instead of a random
moment: together they prove the verification can fail (a replayed batch is counted twice).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from connectors.core.errors import ConnectorError
from connectors.core.options import redact_url
from connectors.demo.runs import last_batch, run_child

WORDS = (
    "apex window kafka spark stream batch commit offset sink source exactly once replay "
    "crash recover ledger rename parquet postgres arrow python driver executor partition"
).split()


FORMATS = ("text", "avro")
#: The input topic's value schema with ``--format avro`` (subject ``<topic>-value``).
LINE_SCHEMA = json.dumps({"type": "record", "name": "Line", "namespace": "eo.demo",
                          "fields": [{"name": "line", "type": "string"}]})


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="use this Kafka instead of starting a local broker")
    p.add_argument("--db-url", help="SQLAlchemy URL for the JDBC sink (default: SQLite file)")
    p.add_argument("--workdir", default=None, help="where checkpoints and output go "
                   "(default: a fresh temp directory, removed unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (the WALs, "
                   "checkpoint, output and database stay there for the CLI: wal show, files "
                   "status, sink status); the demo ends by printing those commands")
    p.add_argument("--keep-broker", action="store_true", help="leave the local Kafka broker "
                   "running after the demo (implies --keep), so lag and transactions can be "
                   "tried too; the demo prints how to stop it")
    p.add_argument("--lines", type=int, default=20000,
                   help="lines of words to produce (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=1000,
                   help="maxOffsetsPerTrigger of the pipeline, lines per micro-batch "
                   "(default: %(default)s)")
    p.add_argument("--kills", type=int, default=1,
                   help="how many times to SIGKILL the pipeline (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="random seed (words and kill times)")
    p.add_argument("--crash-at", default=None, help="kill at this failpoint (e.g. "
                   "'jdbc.after_commit@2') instead of at a random moment")
    p.add_argument("--naive-jdbc", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds per pipeline run (default: %(default)g)")
    p.add_argument("--format", choices=FORMATS, default="text",
                   help="the topics' records: 'text' (lines in, JSON counts out) or 'avro' "
                   "(Avro in the Confluent wire format with a Schema Registry: lines written "
                   "by confluent-kafka's AvroSerializer, read into a typed column, counts "
                   "written as Avro records; default: %(default)s)")
    p.add_argument("--schema-registry", default=None, metavar="URL",
                   help="with --format avro: use this Confluent-compatible registry instead of "
                   "starting a local one (Apicurio, built once from Maven Central)")


@dataclass
class SinkCheck:
    name: str
    rows_out: int
    total_expected: int
    total_got: int
    duplicates: int
    missing: int
    wrong_words: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.missing == 0


def compare(name: str, expected: Counter[str], got: Counter[str], rows_out: int) -> SinkCheck:
    dup = sum(max(0, got[w] - expected[w]) for w in set(got) | set(expected))
    miss = sum(max(0, expected[w] - got[w]) for w in set(got) | set(expected))
    wrong = sorted(w for w in set(got) | set(expected) if got[w] != expected[w])
    return SinkCheck(name, rows_out, sum(expected.values()), sum(got.values()), dup, miss, wrong)


def _progress(done: int, total: int, before: int, width: int = 30) -> None:
    """``done`` of ``total`` lines produced (``before`` at the last call): a bar redrawn in
    place on a terminal; into a pipe or a file (a CI log), a plain line at each quarter
    instead of carriage-return frames."""
    if sys.stdout.isatty():
        filled = int(width * done / max(total, 1))
        sys.stdout.write(f"\r  producing [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
                         + ("\n" if done >= total else ""))
        sys.stdout.flush()
    elif done * 4 // max(total, 1) > before * 4 // max(total, 1):
        print(f"  produced {done}/{total} lines", flush=True)


def produce_lines(bootstrap: str, topic: str, lines: int, partitions: int,
                  rng: random.Random, registry_url: str | None = None) -> Counter[str]:
    """Produce ``lines`` random lines of words; their true word counts. With
    ``registry_url``: each line an Avro record :data:`LINE_SCHEMA`, serialized by
    confluent-kafka's ``AvroSerializer`` (which registers the schema under
    ``<topic>-value``)."""
    from connectors.demo.services.kafka import produce_records

    encode = _avro_serializer(registry_url, topic) if registry_url else (
        lambda text: text.encode())
    truth: Counter[str] = Counter()
    records = []
    for i in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 8))]
        truth.update(words)
        records.append((str(i).encode(), encode(" ".join(words)), i % partitions))
    chunk = max(1, lines // 20)
    produce_records(bootstrap, topic, records, chunk=chunk,
                    on_chunk=lambda done: _progress(done, lines, done - chunk))
    if lines % chunk:
        _progress(lines, lines, lines - lines % chunk)
    return truth


def _avro_serializer(registry_url: str, topic: str) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(SchemaRegistryClient({"url": registry_url}), LINE_SCHEMA)
    context = SerializationContext(topic, MessageField.VALUE)
    return lambda text: serializer({"line": text}, context)


def verify(cfg: dict[str, Any], truth: Counter[str]) -> list[SinkCheck]:
    from connectors.demo.pipeline import read_files_counts, read_jdbc_counts, read_kafka_counts

    checks = []
    got, rows = read_jdbc_counts(cfg)
    checks.append(compare("eo_jdbc (accumulate)", truth, got, rows))
    got, rows = read_kafka_counts(cfg)
    checks.append(compare("eo_kafka (topic)", truth, got, rows))
    got, rows = read_files_counts(cfg)
    checks.append(compare("eo_files (parquet)", truth, got, rows))
    return checks


def run_demo(args: argparse.Namespace) -> int:
    """The demo (``python -m connectors demo``). Its progress lines go to stdout, or to
    stderr with ``--json``, whose report is then the only thing on stdout."""
    from connectors.demo.local_services import start_broker, start_registry

    _check_format(args)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)  # noqa: S311 - demo data and kill times, not crypto
    workdir = args.workdir or tempfile.mkdtemp(prefix="eo-demo-")
    os.makedirs(workdir, exist_ok=True)
    started = time.monotonic()
    broker = registry = None
    cfg: dict[str, Any] | None = None
    stop_broker: str | None = None
    out = sys.stderr if args.json else sys.stdout
    # flushed: into a pipe (``| tee``) or a CI log each line shows when it is said
    say = functools.partial(print, file=out, flush=True)
    try:
        bootstrap = args.bootstrap
        if not bootstrap:
            broker = start_broker(os.path.join(workdir, "kafka"), say)
            bootstrap = broker.bootstrap
            pid = getattr(broker, "pid", None)
            if args.keep_broker and pid:
                # its own session (process group): one signal stops it and its children
                stop_broker = f"kill -TERM -- -{pid}"
        registry_url = None
        if args.format == "avro" and args.schema_registry:
            registry_url = args.schema_registry.rstrip("/")
        elif args.format == "avro":
            registry = start_registry(workdir, say)
            registry_url = registry.url
        cfg = _demo_config(args, seed, workdir, bootstrap, registry_url)
        say(f"metrics: http://127.0.0.1:{cfg['metrics_port']}/metrics while a pipeline run is "
            "up (Prometheus text format; docs/monitoring.md)")
        truth = _produce(args, cfg, seed, rng, say, out)
        crashes = _crash_runs(args, cfg, rng, say)
        say("final run: restart from the checkpoint and finish")
        log_path = os.path.join(workdir, "pipeline.log")
        code, killed = run_child(cfg, kill_at_batch=None, jitter=0.0, failpoint=None,
                                 timeout=args.timeout, log_path=log_path, progress=say)
        if code != 0:
            raise ConnectorError(f"final pipeline run failed (exit {code}); see {log_path}")
        checks = verify(cfg, truth)
        report = _report(args, cfg, seed, truth, crashes, checks, time.monotonic() - started)
        kept = bool(args.workdir or args.keep or args.keep_broker)
        broker_up = broker is None or bool(args.keep_broker)
        commands = inspect_commands(cfg, broker_up) if kept else []
        if kept:
            report["inspect"] = {"workdir": workdir, "bootstrap": bootstrap,
                                 "broker_running": broker_up, "stop_broker": stop_broker,
                                 "commands": [c for c, _ in commands]}
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print_report(report, checks)
            print_inspect(commands, broker_up)
        return 0 if report["ok"] else 1
    finally:
        if cfg is not None:  # Spark's scratch of every run, the killed ones' too
            shutil.rmtree(cfg["scratch"], ignore_errors=True)
        if registry is not None:
            registry.stop()
        if broker is not None and not args.keep_broker:
            broker.stop()
        elif broker is not None:
            say(f"the local Kafka broker keeps running on {broker.bootstrap} (its data and "
                f"log under {os.path.join(workdir, 'kafka')}); stop it with: "
                f"{stop_broker or 'kill its process'}")
        if not args.workdir and not args.keep and not args.keep_broker:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"work directory kept: {workdir}")


def _check_format(args: argparse.Namespace) -> None:
    if args.schema_registry and args.format != "avro":
        raise ConnectorError("demo: --schema-registry is for --format avro; add --format avro "
                             "or leave it out")
    if args.format == "avro":
        try:
            from confluent_kafka.schema_registry.avro import AvroSerializer  # noqa: F401
        except ImportError as e:
            raise ConnectorError(f"demo --format avro needs fastavro and confluent-kafka's "
                                 f"Avro support ({e}): pip install -e '.[demo]'") from None


def _demo_config(args: argparse.Namespace, seed: int, workdir: str, bootstrap: str,
                 registry_url: str | None) -> dict[str, Any]:
    # The seed fixes the data and the kill times; the token keeps a rerun with the same
    # seed against the same broker and database from meeting the last run's topics,
    # table and sink state.
    from connectors.demo.local_services import free_port

    tag = f"{seed:x}_{uuid.uuid4().hex[:6]}"
    return {
        "bootstrap": bootstrap,
        "in_topic": f"demo-lines-{tag}",
        "out_topic": f"demo-counts-{tag}",
        "checkpoint": os.path.join(workdir, "checkpoint"),
        "wal": os.path.join(workdir, "wal"),
        "files": os.path.join(workdir, "files-out"),
        "db_url": args.db_url or f"sqlite:///{os.path.join(workdir, 'wordcount.db')}",
        "table": f"word_counts_{tag}",
        "sink_id": f"demo-{tag}",
        "batch_size": args.batch_size,
        "naive_jdbc": bool(args.naive_jdbc),
        "format": args.format,
        "registry_url": registry_url,
        "log_path": os.path.join(workdir, "pipeline.log"),
        "metrics_port": free_port(),
        # the pipeline runs' temporary files (scratch_env), removed when the demo ends
        "scratch": os.path.join(workdir, "scratch"),
    }


def _produce(args: argparse.Namespace, cfg: dict[str, Any], seed: int, rng: random.Random,
             say: Any, out: Any) -> Counter[str]:
    """The topics, and the input lines produced; their true word counts."""
    import contextlib

    from connectors.demo.services.kafka import create_topic

    create_topic(cfg["bootstrap"], cfg["in_topic"], 4)
    create_topic(cfg["bootstrap"], cfg["out_topic"], 2)
    say(f"producing {args.lines} lines to {cfg['in_topic']} (seed {seed})"
        + (" as Avro records, schema registered under "
           f"{cfg['in_topic']}-value by confluent-kafka's AvroSerializer"
           if cfg["registry_url"] else ""))
    with contextlib.redirect_stdout(out):  # its progress goes where the demo's lines go
        truth = produce_lines(cfg["bootstrap"], cfg["in_topic"], args.lines, 4, rng,
                              cfg["registry_url"])
    say(f"the pipeline runs Spark in a child process (its log: {cfg['log_path']}); every 5 s "
        "it says what each sink has committed")
    return truth


def _crash_runs(args: argparse.Namespace, cfg: dict[str, Any], rng: random.Random,
                say: Any) -> list[dict[str, Any]]:
    """The runs killed mid-stream (``--kills``), each at a random step of a random batch."""
    crashes: list[dict[str, Any]] = []
    n_batches = -(-args.lines // args.batch_size)
    for k in range(args.kills):
        fp, target, jitter = args.crash_at, None, 0.0
        if not fp:
            # Kill once the pipeline has planned a batch it had not planned before (a
            # random 1-3 further), after a random delay: a random protocol step of a
            # random batch, mid-stream, on any machine speed.
            done = last_batch(cfg["checkpoint"])
            done = -1 if done is None else done
            if done + 1 > n_batches - 1:
                say("  every batch is already planned: no mid-stream moment left to kill")
                break
            target = min(done + rng.randint(1, 3), n_batches - 1)
            jitter = rng.uniform(0.0, 2.0)
        what = f"failpoint {fp}" if fp else f"SIGKILL {jitter:.1f}s into batch {target}"
        say(f"run {k + 1}: pipeline with {what}")
        code, killed = run_child(cfg, kill_at_batch=target, jitter=jitter, failpoint=fp,
                                 timeout=args.timeout, log_path=cfg["log_path"], progress=say)
        batch = last_batch(cfg["checkpoint"])
        crashes.append({"run": k + 1, "killed": killed, "exit": code, "batch": batch})
        if killed:
            say(f"  killed (SIGKILL) while batch {batch} was in flight")
        elif code != 0:
            raise ConnectorError(f"pipeline failed with exit code {code}; see "
                                 f"{cfg['log_path']}")
        else:
            say("  finished before the kill")
    return crashes


def _report(args: argparse.Namespace, cfg: dict[str, Any], seed: int, truth: Counter[str],
            crashes: list[dict[str, Any]], checks: list[SinkCheck],
            elapsed: float) -> dict[str, Any]:
    return {
        "ok": all(c.ok for c in checks),
        "seed": seed,
        "format": args.format,
        "sink_id": cfg["sink_id"],
        "lines_in": args.lines,
        "words_in": sum(truth.values()),
        "distinct_words": len(truth),
        "crashes": crashes,
        "kills": sum(1 for c in crashes if c["killed"]),
        "seconds": round(elapsed, 1),
        "db_url": redact_url(cfg["db_url"]),
        "sinks": [dict(c.__dict__, ok=c.ok) for c in checks],
    }


def inspect_commands(cfg: dict[str, Any], broker_up: bool) -> list[tuple[str, str]]:
    """Ready-to-paste CLI commands for what this run left: ``(command, what it shows)``;
    the Kafka ones last, marked when they need a broker that is no longer running."""
    q = shlex.quote
    cli = "python -m connectors"
    url = redact_url(cfg["db_url"])
    kafka_note = "" if broker_up else " [needs a running broker: rerun with --keep-broker]"
    return [
        (f"{cli} wal show {q(cfg['wal'] + '/source')}",
         "eo_kafka source: its windows, committed or pending"),
        (f"{cli} wal show {q(cfg['wal'] + '/kafka-sink')}",
         "eo_kafka sink: its committed batches"),
        (f"{cli} files status {q(cfg['files'])}", "eo_files sink: committed batches and files"),
        (f"{cli} sink status --url {q(url)} --sink-id {q(cfg['sink_id'])}",
         "eo_jdbc sink: its last committed batch" + (
             " (put the password back in place of ***)" if url != cfg["db_url"] else "")),
        (f"{cli} lag --bootstrap {q(cfg['bootstrap'])} --group {q(cfg['sink_id'])} "
         f"--wal-path {q(cfg['wal'] + '/source')}",
         "the source's consumer group against the input topic: its last window stays "
         "pending, and shows as lag, until a next run" + kafka_note),
        (f"{cli} transactions --bootstrap {q(cfg['bootstrap'])} --topic {q(cfg['out_topic'])} "
         f"--sink-id {q(cfg['sink_id'])}",
         "open transactions on the output topic (none: this demo's Kafka sink uses recovery "
         "keys, not transactions)" + kafka_note),
    ]


def print_inspect(commands: list[tuple[str, str]], broker_up: bool) -> None:
    if not commands:
        return
    print("\ninspect what this run left (paste any of these):")
    for command, what in commands:
        print(f"  # {what}\n  {command}")
    if not broker_up:
        print("  (the local broker was stopped: --keep-broker leaves it running, or point "
              "--bootstrap at a broker of your own)")


def print_report(report: dict[str, Any], checks: list[SinkCheck]) -> None:
    kills = report["kills"]
    batches = [c["batch"] for c in report["crashes"] if c["killed"]]
    print()
    print("=" * 72)
    print(f"exactly-once demo ({report['format']}): {report['lines_in']} lines, "
          f"{report['words_in']} words "
          f"({report['distinct_words']} distinct), {kills} SIGKILL(s) "
          f"at batch(es) {batches or '-'}, {report['seconds']}s")
    print("-" * 72)
    print(f"{'sink':<24}{'rows out':>10}{'words in':>10}{'words out':>11}"
          f"{'duplicates':>12}{'missing':>9}")
    for c in checks:
        print(f"{c.name:<24}{c.rows_out:>10}{c.total_expected:>10}{c.total_got:>11}"
              f"{c.duplicates:>12}{c.missing:>9}  {'OK' if c.ok else 'FAIL'}")
    print("-" * 72)
    print("RESULT: " + ("all sinks exactly-once" if report["ok"] else
                        "MISMATCH: " + ", ".join(c.name for c in checks if not c.ok)))
    print("=" * 72)
