"""Spark's Python workers in the tests import pyspark from site-packages, not from pyspark.zip.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and the spark-core jar first on the
``PYTHONPATH`` of every Python process it starts (a worker daemon, each planner runner of a
Python data source, the streaming source and sink runners). A pip-installed pyspark ships
that zip with sources only, and ``zipimport`` neither reads nor writes bytecode caches, so
each such process compiles every pyspark module it imports, and reads the jar's directory of
thousands of entries, again. Profiled with py-spy on the 2-core machine (one Kafka sink
recovery test, three Spark applications): 62 % of the Python workers' CPU was imports, half
of it compiling pyspark from the zip.

The zip holds the same files as the installed package (checked file by file, pyspark 4.3.0:
every module but the zip's own tests byte for byte), so the tests lose nothing by importing
pyspark from site-packages, where pip compiled it at install. :func:`ensure` writes a ``.pth``
file into the virtualenv's site-packages that drops exactly those entries (this pyspark's
zip, py4j's zip when it is the py4j installed, the jars of this pyspark) from ``sys.path``
when any Python of the virtualenv starts. With it (and bytecode caches on:
``scripts/run-tests`` unsets ``PYTHONDONTWRITEBYTECODE``), that recovery test took 25 s
instead of 39, and 31 CPU-seconds instead of 47.

It changes the tests' virtualenv only: the release check installs the package as a user does
and runs without it. ``python -m tests.services.spark_workers --remove`` takes it out.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

#: The file's name in site-packages (``zz`` so it runs after the other ``.pth`` files).
NAME = "zz_eo_tests_spark_workers.pth"


def pth_path() -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / NAME


def pth_line() -> str:
    """The one line of the ``.pth`` file: this pyspark's zip (and py4j's, when it is the
    version installed beside it) and jars, named."""
    import py4j.version
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    lib = home / "python" / "lib"
    zips = [str(lib / "pyspark.zip")]
    py4j_zip = lib / f"py4j-{py4j.version.__version__}-src.zip"
    if py4j_zip.exists():
        zips.append(str(py4j_zip))
    jars = str(home / "jars") + "/"
    return (f"import sys; sys.path[:] = [p for p in sys.path if p not in {zips!r} and not "
            f"(p.startswith({jars!r}) and p.endswith('.jar'))]\n")


def ensure() -> Path:
    """Write the ``.pth`` file when it is missing or names another pyspark; its path."""
    path = pth_path()
    line = pth_line()
    if not path.exists() or path.read_text() != line:
        tmp = path.with_name(f".{NAME}.{os.getpid()}")
        tmp.write_text(line)
        tmp.replace(path)  # the other worker may be writing the same line: no torn file
    return path


def remove() -> None:
    pth_path().unlink(missing_ok=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--remove"]:
        remove()
        print(f"removed {pth_path()}")
    elif sys.argv[1:] in ([], ["--prepare"]):
        print(f"Spark's Python workers import pyspark from site-packages: {ensure()}")
    else:
        sys.exit("usage: python -m tests.services.spark_workers [--prepare | --remove]")
