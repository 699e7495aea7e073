"""HDFS restarted under a streaming query (issue 43, part 2), on a NameNode and a DataNode of
this module's own (``tests/services/hdfs.py``), which ``tests/nemesis.py``'s
:class:`HdfsNemesis` stops and starts again on the same ports and data directories.

1. A streaming query (``eo_kafka`` with its ``walPath`` and ``eo_files`` with its ``path``
   both on HDFS, the checkpoint local), with the default retry budget
   (``storage.retryTimeout``, 120 s), rides through the NameNode stopped, down longer than
   10 s (the former default, which a production NameNode's restart outlasts) and started
   again (coming back in safe mode, as a production NameNode does), then the DataNode
   SIGKILLed and started again: the WebHDFS client retries a refused connection, the safe
   mode's ``SafeModeException``/``RetriableException`` and a DataNode gone mid-write within
   its retry budget. The query never terminates, and its output is exact afterwards: every
   parquet file read with pyarrow from bytes the ``hdfs`` client fetched; the WAL reads back
   whole.
2. A RENAME whose answer is lost (an :class:`~tests.http_proxy.HttpProxy` in front of the
   NameNode drops the first answer of each): the retried RENAME finds its target there,
   the WAL and the file sink read it back, find their own bytes and go on; nothing fails
   and no foreign writer is reported.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors.core.sink import TaskInfo
from connectors.core.storage import (
    check_create_if_absent,
    forget_probes,
    storage_for,
    storage_options_from,
)
from connectors.core.wal import WriteAheadLog, encode
from connectors.files.sink import FileSink
from tests.helpers import assert_exact, unavailable
from tests.http_proxy import HttpProxy
from tests.nemesis import HdfsNemesis
from tests.storage_faults import (
    FaultQuery,
    assert_output_exact,
    assert_wal_reaches_the_end,
    rows,
    topic_records,
)

pytestmark = pytest.mark.xdist_group("storage-faults-hdfs")

#: How long the NameNode stays stopped before it starts again (its JVM then takes 5-15 s on
#: 2 busy cores, and stays in safe mode 3 s after its block report): the outage is longer
#: than the former default budget (10 s) and well within today's (120 s).
DOWN = 10.5


@pytest.fixture(scope="module")
def hdfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A NameNode and a DataNode of this module's own: restarting them disturbs no other
    test (the session's HDFS serves the others)."""
    from connectors.core.errors import ConnectorError
    from connectors.demo.services import maven
    from tests.services.hdfs import LocalHdfs

    missing = maven.java_and_maven()
    if missing is not None:
        unavailable("HDFS", missing)
    try:
        fs = LocalHdfs(workdir=str(tmp_path_factory.mktemp("hdfs-faults")), keep=True).start()
    except ConnectorError as e:
        unavailable("HDFS", f"the NameNode/DataNode did not start: {e}")
    try:
        yield fs
    finally:
        fs.stop()


def _client(fs: Any) -> Any:
    import hdfs as hdfs_client

    return hdfs_client.InsecureClient(fs.webhdfs_url, timeout=30)


def _read_parquet(fs: Any, root: str) -> pa.Table:
    """Every committed parquet file under ``root``, fetched by the ``hdfs`` client, read by
    pyarrow (a name starting with ``_`` or ``.`` on the way is not output, as for
    pyarrow.dataset: staging, logs, temp files)."""
    client = _client(fs)
    tables = []
    for top, _, files in client.walk(root):
        for name in files:
            path = f"{top}/{name}"
            parts = path[len(root):].split("/")
            if name.endswith(".parquet") and not any(p.startswith(("_", ".")) for p in parts):
                with client.read(path) as reader:
                    tables.append(pq.read_table(io.BytesIO(reader.read())))
    return pa.concat_tables(tables)


# -- 1. a streaming query through restarts -----------------------------------------------------
@pytest.fixture
def topic(filled_topic: Any) -> str:
    name: str = filled_topic(topic_records(), partitions=2)
    return name


def test_a_streaming_query_rides_through_a_namenode_then_a_datanode_restart(
        spark: Any, kafka_bootstrap: str, topic: str, hdfs: Any, tmp_path: Any) -> None:
    host = hdfs.webhdfs_url.split("://", 1)[1]
    root = f"webhdfs://{host}/faults-{uuid.uuid4().hex[:8]}"
    namenode = HdfsNemesis(hdfs, "namenode", safe_mode_seconds=3.0)
    datanode = HdfsNemesis(hdfs, "datanode")
    q = FaultQuery(spark, kafka_bootstrap, topic, root, str(tmp_path / "chk"), "hdfs-faults",
                   {}).start()  # the default budget
    try:
        q.progresses(2)
        # stopped, down, started again: it answers, in safe mode for 3 s after its block report
        down = namenode.down(DOWN)
        assert 10.0 < down < 120.0, down
        safe = hdfs.safe_mode()
        q.progresses(2)
        datanode.crash()  # SIGKILL mid-stream, then started again
        q.progresses(2)
        q.query.processAllAvailable()
        q.assert_up()
    finally:
        q.stop()
    assert safe, "the NameNode came back out of safe mode: the fault did not happen"
    assert_output_exact(_read_parquet(hdfs, "/" + root.split("/", 3)[3] + "/out"))
    assert_wal_reaches_the_end(WriteAheadLog(*storage_for(q.wal), "source"))


# -- 2. a RENAME whose answer is lost -------------------------------------------------------------
def test_renames_whose_answers_are_lost_read_back_as_the_writers_own(hdfs: Any) -> None:
    proxy = HttpProxy(hdfs.http_port).start()
    try:
        nemesis = HdfsNemesis(hdfs, "namenode", proxy=proxy)
        nemesis.drop_answer(lambda r: "OP=RENAME" in r.query.upper())
        base = f"webhdfs://127.0.0.1:{proxy.port}/lost-{uuid.uuid4().hex[:8]}"
        options = storage_options_from({"retryTimeout": "30s"}, "tests")

        # the capability probe: its first create's RENAME answer is lost
        forget_probes()
        storage, root = storage_for(base + "/wal", options=options)
        check_create_if_absent(storage, root)
        # the WAL: records and commit markers
        wal = WriteAheadLog(storage, root, "source")
        for seq in range(3):
            # Each create's answer is lost, its retry finds the record there with its own
            # bytes: "already there, identical" (False), not an error.
            assert wal.append(seq, {"window": seq, "end": seq * 10}) is False
            assert wal.commit(seq, {"end": seq * 10}) is None
        # the file sink: staged files renamed into place, the plan, _spark_metadata, the
        # commit record
        sink = FileSink(base + "/out", sink_id="lost-answers",
                        storage_options={"retryTimeout": "30s"})
        sink.check_schema(rows(0, 1).schema)
        for batch in range(3):
            staged = sink.stage(TaskInfo(batch, 0), iter([rows(batch * 100, 100)]))
            sink.commit(batch, [staged])
        assert sink.last_committed() == 2
    finally:
        proxy.stop()
        forget_probes()
    dropped = [entry for entry in proxy.log if entry[2].startswith("drop_answer")]
    assert len(dropped) >= 3 + 6 + 3 * 3, proxy.log  # probe, WAL, sink renames
    direct = f"/{base.split('/', 3)[3]}"
    client = _client(hdfs)
    for seq in range(3):
        with client.read(f"{direct}/wal/source/{seq:020d}.json") as reader:
            assert reader.read() == encode({"window": seq, "end": seq * 10})
    table = _read_parquet(hdfs, direct + "/out")
    assert_exact(table.column("id").to_pylist(), range(300), what="committed ids")
