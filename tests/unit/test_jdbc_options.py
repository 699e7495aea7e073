"""eo_jdbc: option parsing, naming, type rules and SQL generation per dialect (no network)."""

from __future__ import annotations

import pickle
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from connectors.core.errors import JdbcSinkError, OptionError
from connectors.jdbc import dialects as d
from connectors.jdbc.columns import Layout
from connectors.jdbc.modes import Accumulate, Append, CustomSql, Upsert
from connectors.jdbc.options import JdbcSinkOptions, parse_table_name, staging_name
from connectors.jdbc.sink import JdbcSink

BASE = {"url": "sqlite:////tmp/x.db", "table": "t", "sink_id": "s1"}


def opts(**extra: str) -> JdbcSinkOptions:
    return JdbcSinkOptions.from_options({**BASE, **extra})


def test_defaults_and_spark_lowercased_keys() -> None:
    o = JdbcSinkOptions.from_options({"url": "sqlite:////tmp/x.db", "table": "t",
                                      "sink_id": "s1", "createtable": "true",
                                      "batchsize": "500", "retrytimeout": "2s",
                                      "smallbatchrows": "0", "isolationlevel": "serializable"})
    assert (o.mode, o.create_table, o.batch_size, o.retry_timeout) == ("append", True, 500, 2.0)
    assert o.small_batch_rows == 0 and o.isolation_level == "SERIALIZABLE"
    assert o.metadata_table == "eo_sink_commits" and o.staging_table == "eo_stage_s1"


@pytest.mark.parametrize(
    ("options", "option", "fragment"),
    [
        ({"url": "sqlite:////tmp/x.db", "table": "t"}, "sink_id", "required"),
        ({**BASE, "mode": "merge"}, "mode", "valid values"),
        ({**BASE, "mode": "upsert"}, "keys", "required with mode 'upsert'"),
        ({**BASE, "mode": "accumulate", "keys": "w"}, "accumulate", "required"),
        ({**BASE, "mode": "accumulate", "keys": "w", "accumulate": "w"}, "accumulate",
         "repeats key"),
        ({**BASE, "mode": "sql"}, "statement", "required with mode 'sql'"),
        ({**BASE, "statement": "select 1"}, "statement", "only used with mode 'sql'"),
        ({"sink_id": "s", "table": "t"}, "url", "required"),
        ({**BASE, "url": "not a url at all"}, "url", "not a database URL"),
        ({**BASE, "url": "oracle://u:pw@h/db"}, "url", "does not support"),
        ({**BASE, "url": "sqlite://"}, "url", "in-memory"),
        ({**BASE, "isolationLevel": "NONE"}, "isolationLevel", "without a transaction"),
        ({**BASE, "batchSize": "0"}, "batchSize", ">= 1"),
        ({**BASE, "table": "a.b.c"}, "table", "not a table name"),
        ({"url": "sqlite:////tmp/x.db", "sink_id": "s"}, "table", "required"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], option: str, fragment: str) -> None:
    with pytest.raises(OptionError) as e:
        JdbcSinkOptions.from_options(options)
    assert e.value.option == option
    assert option in str(e.value) and fragment in str(e.value)


def test_url_password_is_never_shown() -> None:
    with pytest.raises(OptionError) as e:
        JdbcSinkOptions.from_options({**BASE, "url": "oracle://u:hunter2@h/db"})
    assert "hunter2" not in str(e.value)
    sink = JdbcSink("postgresql://u:hunter2@h/db", "t", "s")
    assert "hunter2" not in repr(sink) and "hunter2" not in repr(sink.options)


def test_url_normalization_picks_our_drivers() -> None:
    assert d.normalize_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert d.normalize_url("jdbc:postgresql://h:5432/db").drivername == "postgresql+psycopg"
    assert d.normalize_url("mysql://root@h/db").drivername == "mysql+pymysql"
    assert d.normalize_url("sqlite:///rel.db").drivername == "sqlite"


def test_python_constructor_matches_spark_options() -> None:
    a = JdbcSink("sqlite:////tmp/x.db", "s.t", "sink", mode="accumulate", keys=["w"],
                 accumulate="n", create_table=True, retry_timeout=5)
    b = JdbcSink.from_options({"url": "sqlite:////tmp/x.db", "table": "s.t", "sinkId": "sink",
                               "mode": "accumulate", "keys": "w", "accumulate": "n",
                               "createTable": "true", "retryTimeout": "5s"}, pa.schema([]))
    assert a.options == b.options
    assert (a.options.table_schema, a.options.table) == ("s", "t")
    assert a.options.staging_schema == "s"
    # Picklable spec: no connection, no engine.
    again = pickle.loads(pickle.dumps(a))
    assert again.options == a.options


def test_retry_deadline_is_a_deprecated_name_of_retry_timeout() -> None:
    with pytest.warns(DeprecationWarning, match="'retryDeadline' is deprecated.*'retryTimeout'"):
        spark = JdbcSinkOptions.from_options({**BASE, "retryDeadline": "7s"})
    with pytest.warns(DeprecationWarning, match="'retry_deadline' is deprecated.*'retry_timeout'"):
        python = JdbcSink(BASE["url"], "t", "s1", retry_deadline=7).options
    assert spark.retry_timeout == python.retry_timeout == 7.0
    with pytest.warns(DeprecationWarning, match="retry_timeout"):
        assert python.retry_deadline == 7.0
    with pytest.raises(OptionError, match="cannot be used together"):
        JdbcSinkOptions.from_options({**BASE, "retryDeadline": "7s", "retryTimeout": "7s"})
    with pytest.raises(OptionError, match="'retry_deadline' cannot be used together"):
        JdbcSink(BASE["url"], "t", "s1", retry_deadline=7, retry_timeout=8)


def test_python_errors_name_the_python_argument() -> None:
    with pytest.raises(OptionError, match=r"option 'batch_size' is out of range \(0\); it must "
                       r"be >= 1") as e:
        JdbcSink(BASE["url"], "t", "s1", batch_size=0)
    assert e.value.option == "batch_size"
    with pytest.raises(OptionError, match="option 'batch_size' must be an integer, got 1.5"):
        JdbcSink(BASE["url"], "t", "s1", batch_size=1.5)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="'create_table' needs option 'table'"):
        JdbcSink(BASE["url"], None, "s1", mode="sql", statement="select 1", create_table=True)
    with pytest.raises(OptionError, match="'isolation_level' has invalid value 'NONE'"):
        JdbcSink(BASE["url"], "t", "s1", isolation_level="NONE")
    # a string is read as the Spark option would be
    assert JdbcSink(BASE["url"], "t", "s1", retry_timeout="500ms").options.retry_timeout == 0.5


def test_the_mode_is_chosen_once_as_a_type() -> None:
    assert opts().write_mode == Append() and opts(keys="k").write_mode == Append(("k",))
    assert opts(mode="UPSERT", keys="a,b").write_mode == Upsert(("a", "b"))
    acc = opts(mode="accumulate", keys="w", accumulate="n,m")
    assert acc.write_mode == Accumulate(("w",), ("n", "m"))
    assert (acc.mode, acc.keys, acc.accumulate, acc.statement) == ("accumulate", ("w",),
                                                                   ("n", "m"), None)
    sql = JdbcSinkOptions.from_options({"url": BASE["url"], "sink_id": "s", "mode": "sql",
                                        "statement": "insert into t values (:w)"})
    assert sql.write_mode == CustomSql("insert into t values (:w)") and sql.table is None
    assert pickle.loads(pickle.dumps(acc)) == acc


def test_table_names_and_staging_names() -> None:
    assert parse_table_name("t", "table") == (None, "t")
    assert parse_table_name("s.t", "table") == ("s", "t")
    assert parse_table_name('"My S"."My ""T"""', "table") == ("My S", 'My "T"')
    assert staging_name("wordcount") == "eo_stage_wordcount"
    a, b = staging_name("a-b"), staging_name("a_b")
    assert a != b and a.startswith("eo_stage_a_b_")
    assert len(staging_name("x" * 200)) <= 63


def test_type_rules() -> None:
    spec = d.column_spec("n", "n", pa.int64(), sa.Integer(), postgresql.dialect())
    assert spec.category == "int" and spec.int_bits == 32
    d.check_compatible("t", pa.field("n", pa.int32()), spec)
    with pytest.raises(JdbcSinkError, match=r"'t'.*'n'.*INTEGER.*double"):
        d.check_compatible("t", pa.field("n", pa.float64()), spec)
    text = d.column_spec("s", "s", pa.string(), sa.Text(), postgresql.dialect())
    with pytest.raises(JdbcSinkError, match="not supported"):
        d.check_compatible("t", pa.field("s", pa.list_(pa.int32())), text)
    uuid_col = d.column_spec("u", "u", pa.string(), postgresql.UUID(), postgresql.dialect())
    d.check_compatible("t", pa.field("u", pa.string()), uuid_col)  # PostgreSQL parses it


def test_value_checks_name_table_column_and_type() -> None:
    spec = d.column_spec("n", "n", pa.int64(), sa.SmallInteger(), postgresql.dialect())
    batch = pa.record_batch({"n": pa.array([1, 70000], pa.int64())})
    with pytest.raises(JdbcSinkError, match=r"table 't', column 'n' \(SMALLINT\).*70000"):
        d.check_values("t", batch, [spec])
    short = d.column_spec("s", "s", pa.string(), sa.String(3), postgresql.dialect())
    with pytest.raises(JdbcSinkError, match=r"column 's' \(VARCHAR\(3\)\).*4 characters"):
        d.check_values("t", pa.record_batch({"s": ["abcd"]}), [short])
    d.check_values("t", pa.record_batch({"s": ["abc", None]}), [short])


def _layout(*columns: tuple[str, pa.DataType, sa.types.TypeEngine]) -> Layout:
    return Layout(tuple(d.column_spec(n, n, a, t, sqlite.dialect()) for n, a, t in columns))


def _compile(stmt: object, dialect: sa.Dialect) -> str:
    return str(stmt.compile(dialect=dialect))  # type: ignore[attr-defined]


class _Capture:
    def __init__(self) -> None:
        self.statements: list[object] = []

    def execute(self, stmt: object, *a: object) -> None:
        self.statements.append(stmt)


@pytest.mark.parametrize(
    ("dialect_cls", "sa_dialect", "conflict", "added"),
    [
        (d.PostgresDialect, postgresql.dialect(), "ON CONFLICT (word) DO UPDATE",
         'coalesce("s 1"."my table".n, 0) + coalesce(excluded.n, 0)'),
        (d.SqliteDialect, sqlite.dialect(), "ON CONFLICT (word) DO UPDATE",
         'coalesce("s 1"."my table".n, 0) + coalesce(excluded.n, 0)'),
        (d.MysqlDialect, mysql.dialect(), "ON DUPLICATE KEY UPDATE",
         "coalesce(`s 1`.`my table`.n, 0) + coalesce(VALUES(n), 0)"),
    ],
)
def test_accumulate_sql_per_dialect(dialect_cls: type, sa_dialect: sa.Dialect, conflict: str,
                                    added: str) -> None:
    dia = dialect_cls(sa.engine.make_url("sqlite:////tmp/x.db"), 1.0)
    target = sa.Table("my table", sa.MetaData(), sa.Column("word", sa.Text, primary_key=True),
                      sa.Column("n", sa.BigInteger), sa.Column("seen", sa.DateTime),
                      schema="s 1")
    stage = dia.stage_table("eo_stage_x", "s 1", [("word", sa.Text()), ("n", sa.BigInteger()),
                                                   ("seen", sa.DateTime())])
    cap = _Capture()
    where = stage.c.eo_batch == 3
    layout = _layout(("word", pa.string(), sa.Text()), ("n", pa.int64(), sa.BigInteger()),
                     ("seen", pa.timestamp("us"), sa.DateTime()))
    Accumulate(("word",), ("n",)).apply(cap, dia, target, stage, layout, where, 100)
    text = _compile(cap.statements[0], sa_dialect)
    assert conflict in text and added in text
    assert "GROUP BY" in text and "sum(" in text and "max(" in text
    # Identifiers are quoted by the dialect, never pasted.
    q = "`" if sa_dialect.name == "mysql" else '"'
    assert f"{q}s 1{q}.{q}my table{q}" in text


def test_upsert_without_other_columns_does_nothing_on_conflict() -> None:
    dia = d.PostgresDialect(sa.engine.make_url("postgresql+psycopg://h/db"), 1.0)
    target = sa.Table("t", sa.MetaData(), sa.Column("k", sa.Integer, primary_key=True))
    stage = dia.stage_table("st", None, [("k", sa.Integer())])
    cap = _Capture()
    layout = _layout(("k", pa.int32(), sa.Integer()))
    Upsert(("k",)).apply(cap, dia, target, stage, layout, stage.c.eo_batch == 1, 100)
    assert "ON CONFLICT (k) DO NOTHING" in _compile(cap.statements[0], postgresql.dialect())


def test_postgres_staging_table_is_logged_unless_durable_staging_is_off() -> None:
    from sqlalchemy.schema import CreateTable

    url = sa.engine.make_url("postgresql+psycopg://h/db")
    for durable, start in ((True, "CREATE TABLE st"), (False, "CREATE UNLOGGED TABLE st")):
        stage = d.PostgresDialect(url, 1.0, durable).stage_table("st", None,
                                                                 [("k", sa.Integer())])
        ddl = str(CreateTable(stage).compile(dialect=postgresql.dialect()))
        assert ddl.strip().startswith(start)


def test_transient_error_classification() -> None:
    import psycopg

    pg = d.PostgresDialect(sa.engine.make_url("postgresql+psycopg://h/db"), 1.0)

    class Serialization(psycopg.errors.SerializationFailure):
        pass

    assert pg.is_transient(psycopg.OperationalError("server closed the connection"))
    assert pg.is_transient(psycopg.errors.SerializationFailure("could not serialize"))
    assert not pg.is_transient(psycopg.errors.UndefinedColumn("no column"))
    assert not pg.is_transient(ValueError("x"))
    lite = d.SqliteDialect(sa.engine.make_url("sqlite:////tmp/x.db"), 1.0)
    import sqlite3

    assert lite.is_transient(sqlite3.OperationalError("database is locked"))
    assert not lite.is_transient(sqlite3.OperationalError("no such column: x"))
    my = d.MysqlDialect(sa.engine.make_url("mysql+pymysql://h/db"), 1.0)

    class Deadlock(Exception):
        pass

    assert my.is_transient(Deadlock(1213, "Deadlock found"))
    assert not my.is_transient(Deadlock(1054, "Unknown column"))


def test_create_table_types() -> None:
    assert isinstance(d.arrow_to_sql_type(pa.int64(), "postgresql"), sa.BigInteger)
    assert isinstance(d.arrow_to_sql_type(pa.string(), "mysql", key=True), sa.String)
    assert d.arrow_to_sql_type(pa.string(), "mysql", key=True).length == 255
    ts = d.arrow_to_sql_type(pa.timestamp("us", tz="UTC"), "postgresql")
    assert isinstance(ts, sa.DateTime) and ts.timezone
    with pytest.raises(JdbcSinkError, match="cannot create a column"):
        d.arrow_to_sql_type(pa.list_(pa.int8()), "sqlite")


def test_the_retry_budget_options_and_their_defaults() -> None:
    o = opts()
    assert (o.connect_timeout, o.retry_timeout, o.max_retries, o.retry_backoff,
            o.retry_backoff_max) == (5.0, 120.0, 60, 0.1, 5.0)
    assert o.durable_staging is True
    o = opts(retryTimeout="3m", maxRetries="5", retryBackoff="250ms", retryBackoffMax="3s",
             durableStaging="false", connectTimeout="2s")
    assert (o.connect_timeout, o.retry_timeout, o.max_retries, o.retry_backoff,
            o.retry_backoff_max) == (2.0, 180.0, 5, 0.25, 3.0)
    assert o.durable_staging is False
    python = JdbcSink(BASE["url"], "t", "s1", max_retries=0, retry_backoff=0.5).options
    assert (python.max_retries, python.retry_backoff) == (0, 0.5)


@pytest.mark.parametrize(
    ("extra", "option", "fragment"),
    [
        ({"maxRetries": "-1"}, "maxRetries", ">= 0"),
        ({"retryBackoff": "0s"}, "retryBackoff", "> 0"),
        ({"retryBackoff": "2s", "retryBackoffMax": "1s"}, "retryBackoffMax", "below option "
         "'retryBackoff'"),
    ],
)
def test_bad_retry_budgets_name_the_option(extra: dict[str, str], option: str,
                                           fragment: str) -> None:
    with pytest.raises(OptionError, match=fragment) as e:
        opts(**extra)
    assert e.value.option == option


def test_mariadb_integer_display_widths_do_not_count_as_a_changed_staging_table() -> None:
    """MariaDB reflects the staging table's tags as BIGINT(20)/INT(11); read as a change of
    columns, every new process's preparation (a DataSource commit runs in one) dropped the
    staging table and the tasks' staged rows with it."""
    from types import SimpleNamespace

    from sqlalchemy.dialects.mysql import BIGINT, INTEGER

    from connectors.jdbc.tables import _same_columns, _type_text

    conn: Any = SimpleNamespace(dialect=mysql.dialect())
    wanted = [("eo_batch", _type_text(sa.BigInteger(), conn)),
              ("eo_writer", _type_text(sa.Integer(), conn))]
    reflected = [("eo_batch", _type_text(BIGINT(display_width=20), conn)),
                 ("eo_writer", _type_text(INTEGER(display_width=11), conn))]
    assert _same_columns(wanted, reflected)
    assert not _same_columns(wanted, [("eo_batch", "BIGINT"), ("eo_writer", "VARCHAR(10)")])
