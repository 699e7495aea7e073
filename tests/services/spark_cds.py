"""A class-data-sharing archive of Spark's JVM classes, for the Spark JVMs the tests start.

A recovery test starts a Spark driver once per kill, and most of a short JVM's start is
loading and verifying Spark's classes. Java's dynamic CDS archive (JDK 13+) keeps them
parsed and verified in one file the JVM maps at start: measured on the 2-core CI machine, a
local session's start, a shuffle and an Arrow UDF took 7.4 s of CPU and 6.8 s of wall time
with the tests' JVM flags alone, 3.9 s and 3.5 s with the archive.

The archive is valid for one JDK and one set of Spark jars (the JVM checks both at start and
runs without it, as if it did not exist, when either changed), so it is kept beside the
virtualenv's pyspark, named after the JDK, and made on the first test that starts Spark
(:func:`ensure`, about 15 s, once per virtualenv), under a file lock the other worker waits
on. A failure to make it costs speed, never a test: the JVMs run without it.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

REPO = str(Path(__file__).resolve().parents[2])

#: What the archiving run does: a shuffle, an Arrow UDF, a Python data source and a
#: streaming query, so the classes of the tests' common paths are in the archive.
JOB = r"""
import os, sys, tempfile
from tests.helpers import spark_builder
from pyspark.sql.datasource import DataSource, DataSourceReader
import pyspark.sql.functions as F

class Rows(DataSource):
    @classmethod
    def name(cls): return "eo_cds_rows"
    def schema(self): return "id int"
    def reader(self, schema): return RowsReader()

class RowsReader(DataSourceReader):
    def read(self, partition):
        yield from ((i,) for i in range(10))

spark = spark_builder("eo-cds", "local[2]", **{
    "spark.driver.extraJavaOptions": sys.argv[1]}).getOrCreate()
spark.dataSource.register(Rows)
assert spark.read.format("eo_cds_rows").load().count() == 10
spark.range(0, 100000).selectExpr("id % 10 as k").groupBy("k").count().collect()

@F.pandas_udf("string")
def tag(s):
    return "B:" + s

spark.range(0, 1000).selectExpr("cast(id as string) as s").select(tag("s")).collect()
with tempfile.TemporaryDirectory() as tmp:
    os.makedirs(tmp + "/in")
    with open(tmp + "/in/a.json", "w") as f:
        f.write('{"id": 1}\n')
    q = (spark.readStream.schema("id long").json(tmp + "/in").writeStream
         .foreachBatch(lambda df, b: df.count())
         .option("checkpointLocation", tmp + "/chk").trigger(availableNow=True).start())
    q.awaitTermination()
spark.stop()
"""


def archive_path() -> Path | None:
    """Where the archive of this virtualenv's pyspark and this JDK is (whether it exists or
    not), or None when no ``java`` is found."""
    java = shutil.which("java", path=_java_path())
    if java is None:
        return None
    real = os.path.realpath(java)
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    key = hashlib.sha256(f"{real}:{os.stat(real).st_mtime_ns}:{pyspark.__version__}:"
                       f"{jars}".encode()).hexdigest()[:16]
    return Path(sys.prefix) / "eo-spark-cds" / f"spark-{pyspark.__version__}-{key}.jsa"


def ensure(flags: str, timeout: float = 300.0) -> Path | None:
    """The archive, made first if it is missing (see the module docstring); None if it
    cannot be made (the reason is logged once)."""
    path = archive_path()
    if path is None:
        return None
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker makes it: wait for that
        if path.exists():
            return path
        failed = path.with_suffix(".failed")
        if failed.exists():
            return None
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            done = subprocess.run(
                [sys.executable, "-c", JOB, f"{flags} -XX:ArchiveClassesAtExit={tmp}"],
                env=_job_env(), cwd=REPO, capture_output=True, text=True, timeout=timeout,
                check=False)
            ok = done.returncode == 0 and tmp.exists()
            reason = (done.stdout + done.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            ok, reason = False, f"the archiving run took over {timeout}s"
        if not ok:
            failed.write_text(reason)
            log.warning("no CDS archive of Spark's classes (the tests run without it): %s",
                        reason)
            tmp.unlink(missing_ok=True)
            return None
        os.replace(tmp, path)
        return path


#: The machine's yardstick (:func:`yardstick`): what the module docstring measured, a local
#: session's start, a shuffle and an Arrow pass, with the tests' JVM flags and the archive.
YARDSTICK = r"""
import sys
from tests.helpers import spark_builder
spark = spark_builder("eo-yardstick", "local[2]", **{
    "spark.driver.extraJavaOptions": sys.argv[1]}).getOrCreate()
spark.range(0, 100000).selectExpr("id % 10 as k").groupBy("k").count().collect()
spark.range(0, 20000).selectExpr("cast(id as string) as s").mapInArrow(
    lambda batches: batches, "s string").collect()
spark.stop()
"""

#: The yardstick's seconds on 2026-11-29, the day `.ci/run` took 36.8 min (tests/README.md).
YARDSTICK_REFERENCE_S = 3.5


def yardstick(flags: str, timeout: float = 300.0) -> float:
    """Seconds of wall time the :data:`YARDSTICK` job takes here with the JVM options
    ``flags``: printed by ``scripts/run-tests`` before the integration tests, so that a run's
    minutes can be read against the machine's speed that day."""
    import time

    began = time.monotonic()
    subprocess.run([sys.executable, "-c", YARDSTICK, flags], env=_job_env(), cwd=REPO,
                   check=True, capture_output=True, timeout=timeout)
    return time.monotonic() - began


def _job_env() -> dict[str, str]:
    """A job's environment: this repository importable, this interpreter for Spark's Python."""
    return {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def _java_path() -> str:
    home = os.environ.get("JAVA_HOME")
    path = os.environ.get("PATH", "")
    return f"{home}/bin{os.pathsep}{path}" if home else path


if __name__ == "__main__":
    from tests.helpers import jvm_options, prepare_spark_jvms

    prepare_spark_jvms()  # the archive, as the first Spark test would make it
    seconds = yardstick(jvm_options())
    print(f"machine yardstick: a Spark session's start, a shuffle and an Arrow pass took "
          f"{seconds:.1f} s ({YARDSTICK_REFERENCE_S} s on 2026-11-29, when .ci/run took 36.8 min; "
          f"tests/README.md, \"Time budget\")")
