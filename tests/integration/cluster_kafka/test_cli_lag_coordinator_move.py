"""``eo-connectors lag`` while the group's coordinator moves (issue 36, item 0).

Three processes run lag against the group back to back while the node coordinating it is
stopped (a controlled shutdown), started again and made leader again by a preferred leader
election, then the same with a kill: four moves of the coordinator, two of them away from a
node that keeps running and so answers ``NOT_COORDINATOR``. Every run answers with the
group's offsets; no process dies.

lag used librdkafka's admin ``ListConsumerGroupOffsets``, which dereferences a NULL consumer
group when an OffsetFetch is answered ``NOT_COORDINATOR`` (librdkafka #5040): in this test
it died with SIGSEGV in two of the three processes. lag now reads the offsets with a
consumer of the group (``connectors/kafka/lookup.py``). Each loop is a subprocess, so a
crash is a negative return code, not a dead pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

from connectors.demo.services.kafka import produce_records
from tests.helpers import REPO

#: lag in one process, again and again until the stop file appears: prints the number of
#: runs, and exits 1 at the first run that fails or answers other offsets than expected.
_LOOP = r"""
import contextlib, io, json, os, sys
from connectors import cli
stop, expected, argv = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
runs = 0
while not os.path.exists(stop):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    runs += 1
    got = [[p["partition"], p["committed"], p["lag"]]
           for p in json.loads(out.getvalue())["partitions"]] if code == 0 else None
    if got != expected:
        print(f"run {runs}: exit {code}, {got}: {err.getvalue()[-2000:]}")
        sys.exit(1)
print(runs)
"""


def _commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit ``offsets`` for ``group``, until every partition's commit succeeded: a sync
    commit reports a partition's failure in its result, not as an exception (on a new
    cluster the first commit can meet __consumer_offsets still being created)."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                done = consumer.commit(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                    asynchronous=False)
                errors = [tp.error for tp in done or [] if tp.error is not None]
            except Exception as e:  # noqa: BLE001 - asked again until the deadline
                errors = [e]
            if not errors:
                return
            assert time.monotonic() < deadline, f"committing {offsets}: {errors}"
            time.sleep(0.5)
    finally:
        consumer.close()


def _elect_preferred_leaders(cluster: Any) -> None:
    """Every partition back to its preferred leader: the coordinator moves back to the node
    that came back."""
    done = subprocess.run(  # noqa: S603 - Kafka's own tool from the cluster's jars
        cluster.nodes[0].java("org.apache.kafka.tools.LeaderElectionCommand",
                              "--bootstrap-server", cluster.bootstrap,
                              "--election-type", "PREFERRED", "--all-topic-partitions"),
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_lag_answers_while_the_groups_coordinator_moves(cluster: Any, cluster_topic: Any,
                                                        tmp_path: Any) -> None:
    topic = cluster_topic(partitions=2)
    produce_records(cluster.bootstrap, topic,
                    [(None, b"v", p) for p in (0, 1) for _ in range(8)])
    group = f"lag-{uuid.uuid4().hex[:8]}"
    _commit(cluster.bootstrap, group, {(topic, 0): 3, (topic, 1): 8})
    expected = json.dumps([[0, 3, 5], [1, 8, 0]])
    stop = str(tmp_path / "stop")
    argv = ["lag", "--bootstrap", cluster.bootstrap, "--group", group, "--json",
            "--timeout", "60"]
    # Right after the commit, on the session's new cluster, a plain OffsetFetch could
    # answer "no committed offsets" (CI, twice): lag now asks again stably where the plain
    # answer has none (lookup.stable_committed), so the first run must answer too.
    first = subprocess.run(  # noqa: S603 - our own module
        [sys.executable, "-m", "connectors", *argv], cwd=REPO, capture_output=True,
        text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr[-2000:]
    assert json.dumps([[p["partition"], p["committed"], p["lag"]]
                       for p in json.loads(first.stdout)["partitions"]]) == expected
    loops = [subprocess.Popen(  # noqa: S603 - our own module
        [sys.executable, "-c", _LOOP, stop, expected, *argv], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    moves = []
    try:
        for fault in ("stop", "kill"):
            node = cluster.group_coordinator(group)
            getattr(cluster, fault)(node)  # returns once the node is fenced: the group moved
            moves.append((node, cluster.group_coordinator(group)))
            cluster.restart(node)
            cluster.wait_in_sync()
            _elect_preferred_leaders(cluster)
            moves.append((moves[-1][1], cluster.group_coordinator(group)))
    finally:
        open(stop, "w").close()
        results = [(p, *p.communicate(timeout=240)) for p in loops]
    assert all(a != b for a, b in moves), moves
    for proc, out, err in results:
        assert proc.returncode >= 0, f"lag died with signal {-proc.returncode}: {err[-2000:]}"
        assert proc.returncode == 0, out[-2000:] + err[-2000:]
        assert int(out.strip()) >= 5, out  # it ran all along, not once
