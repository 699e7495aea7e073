"""The tests' ``.pth`` file (tests/services/spark_workers.py) drops this pyspark's zip and jars
from a Python's path, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pyspark

from tests.services import spark_workers


def test_the_line_drops_this_pysparks_zip_and_jars_only():
    home = Path(pyspark.__file__).resolve().parent
    keep = ["/repo", "/other/spark/python/lib/pyspark.zip", "/usr/lib/python311.zip",
            str(home.parent), "/elsewhere/x.jar"]
    import py4j.version

    py4j_zip = home / "python" / "lib" / f"py4j-{py4j.version.__version__}-src.zip"
    drop = [str(home / "python" / "lib" / "pyspark.zip"),
            str(home / "jars" / "spark-core_2.13-4.3.0.jar"),
            *([str(py4j_zip)] if py4j_zip.exists() else [])]
    scope = {"sys": type("S", (), {"path": [drop[0], keep[0], *drop[1:], *keep[1:]]})}
    line = spark_workers.pth_line()
    assert line.startswith("import sys;") and line.endswith("\n") and line.count("\n") == 1
    exec(line.removeprefix("import sys;").strip(), scope)  # noqa: S102 - the line site.py would run
    assert scope["sys"].path == keep


def test_the_zip_holds_what_site_packages_holds():
    """What makes dropping the zip safe: every module the zip holds is the installed file,
    byte for byte, but its tests and its streaming benchmark, which pip does not install."""
    import zipfile

    home = Path(pyspark.__file__).resolve().parent
    archive = home / "python" / "lib" / "pyspark.zip"
    with zipfile.ZipFile(archive) as z:
        modules = [n for n in z.namelist() if n.endswith(".py")]
        missing = [n for n in modules if not (home.parent / n).exists()]
        assert [n for n in missing if "/tests/" not in n and "/benchmark/" not in n] == []
        modules = [n for n in modules if n not in missing]
        assert len(modules) > 300
        differ = [n for n in modules if z.read(n) != (home.parent / n).read_bytes()]
    assert differ == []
