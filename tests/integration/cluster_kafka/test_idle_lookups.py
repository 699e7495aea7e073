"""The wire client's look-ups after the brokers closed their idle connections (issue 42).

Every node of the cluster tier closes connections idle for 5 s (conftest.py). The source's
driver asks ListOffsets (and the Metadata before it) at every trigger, but a query that
fell behind, or a retry backing off for longer than the brokers' idle limit, comes back to
connections the brokers have closed. Each must be found closed before a request goes into
it: sent into a dead connection, every request of a retry with a backoff longer than the
idle limit met a closed connection, and a source query failed after ``metadataRetryTimeout``
with every node up (the landing CI run of fb7d7ca).
"""

from __future__ import annotations

import time

from connectors.kafka.wire import admin
from connectors.kafka.wire.cluster import Cluster
from connectors.kafka.wire.settings import Settings
from tests.integration.cluster_kafka.conftest import IDLE_MS


def test_list_offsets_after_the_brokers_closed_idle_connections_needs_no_retry(
        cluster, cluster_topic):
    topic = cluster_topic(4)
    client = Cluster(Settings.of({"bootstrap.servers": cluster.bootstrap}))
    wanted = {(topic, p): admin.LATEST for p in range(4)}
    try:
        assert admin.list_offsets(client, wanted, admin.READ_UNCOMMITTED, 60) == \
            dict.fromkeys(wanted, 0)
        assert len(client.connections) >= 1  # the leaders' connections, cached
        time.sleep(IDLE_MS / 1000 + 2)
        # timeout=0: one attempt, no retry. A request sent into a closed connection fails it.
        assert admin.list_offsets(client, wanted, admin.READ_UNCOMMITTED, timeout=0) == \
            dict.fromkeys(wanted, 0)
    finally:
        client.close()
