"""librdkafka's admin requests under node kills, alone: does the process abort?

Issue 42 saw query processes abort inside librdkafka
(``rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt > 0' failed``) while Kafka
nodes were killed, right after a Describe of the ACL preflight timed out "waiting for
controller". This runs the admin requests the connectors used in a query's processes, with
confluent-kafka only, against the 3-node cluster of the fault tier, while one node after
another is SIGKILLed and restarted:

- ``describe_consumer_groups`` and ``list_consumer_group_offsets`` (sent to the group
  coordinator through librdkafka's coordinator look-up);
- ``describe_topics`` with authorized operations (sent to the controller);
- ``list_offsets`` (sent to the partitions' leaders).

Each kind runs in worker processes of its own, each making a new AdminClient every few
requests with a short request timeout, so the timeouts race the node kills; a worker that
dies by a signal is restarted and counted, with the assertion line it printed.

    python scripts/repro_librdkafka_admin_abort.py --minutes 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections import Counter

KINDS = ("describe_groups", "group_offsets", "describe_topics", "list_offsets")


def worker(kind: str, bootstrap: str, topic: str, group: str, until: float) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicCollection, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    n = 0
    while time.time() < until:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        for _ in range(5):
            try:
                if kind == "describe_groups":
                    futures = admin.describe_consumer_groups(
                        [group], request_timeout=1.5, include_authorized_operations=True)
                elif kind == "group_offsets":
                    futures = admin.list_consumer_group_offsets(
                        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])],
                        request_timeout=1.5)
                elif kind == "describe_topics":
                    futures = admin.describe_topics(TopicCollection([topic]), request_timeout=1.5,
                                                    include_authorized_operations=True)
                else:
                    futures = admin.list_offsets(
                        {TopicPartition(topic, p): OffsetSpec.latest() for p in range(4)},
                        request_timeout=1.5)
                for f in futures.values():
                    f.result()
            except Exception:  # noqa: BLE001, S110 - only an abort matters here
                pass
            n += 1
            time.sleep(0.1)  # leave the brokers room to restart
        del admin


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--workers", type=int, default=1, help="processes per request kind")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from confluent_kafka import Consumer, TopicPartition

    from connectors.demo.services.kafka_cluster import KafkaCluster

    work = tempfile.mkdtemp(prefix="librdkafka-abort-")
    rng = random.Random(int(os.environ.get("SEED", "1")))
    aborts: Counter[str] = Counter()
    lines: set[str] = set()
    with KafkaCluster(workdir=work) as cluster:
        topic, group = "abort-probe", "abort-probe-group"
        cluster.create_topic(topic, 4)
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
        c.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        c.close()
        until = time.time() + args.minutes * 60
        ctx = multiprocessing.get_context("spawn")
        procs: dict[object, tuple[str, str]] = {}

        def start(kind: str, i: int) -> None:
            err = os.path.join(work, f"{kind}-{i}-{time.time_ns()}.err")
            proc = ctx.Process(target=_run, args=(kind, cluster.bootstrap, topic, group, until,
                                                  err))
            proc.start()
            procs[proc] = (kind, err)

        for kind in KINDS:
            for i in range(args.workers):
                start(kind, i)
        kills = 0

        def reap(final: bool = False) -> None:
            for proc, (kind, err) in list(procs.items()):
                if final:
                    proc.join(60)
                if not proc.is_alive() and proc.exitcode not in (0, None):
                    aborts[kind] += 1
                    text = open(err, errors="replace").read()
                    lines.update(x for x in text.splitlines() if "ssert" in x)
                    del procs[proc]
                    if not final and time.time() < until:
                        start(kind, 99)

        try:
            while time.time() < until:
                time.sleep(rng.uniform(2, 6))
                victim = rng.choice([cluster.group_coordinator(group), cluster.leader(topic, 0),
                                     rng.choice([n.node_id for n in cluster.nodes])])
                cluster.kill(victim, wait=False)
                kills += 1
                time.sleep(rng.uniform(3, 8))
                reap()
                cluster.restart(victim, timeout=300)
                cluster.wait_in_sync(timeout=300)
                reap()
        finally:
            reap(final=True)
            print("RESULT " + json.dumps({"minutes": args.minutes, "node_kills": kills,
                                          "aborted_processes": dict(aborts),
                                          "assertions": sorted(lines)}), flush=True)
    return 0


def _run(kind: str, bootstrap: str, topic: str, group: str, until: float, err: str) -> None:
    fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    worker(kind, bootstrap, topic, group, until)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
