"""The release check (issue 50; step 6 of scripts/run-tests, after the test tiers): the
package installed as a user installs it, on the lowest and the highest Python and pyspark
that pyproject.toml declares, outside the repository.

1. ``python -m build`` (this interpreter) makes an sdist and a wheel; the wheel must hold
   the three C extensions, ``py.typed`` and the demo's pom files.
2. The lowest Python declared (the lowest ``Programming Language :: Python :: 3.X``
   classifier, which a unit test holds to ``requires-python``), with the lowest pyspark
   declared (``pyspark>=X`` -> ``pyspark==X``): a wheel built from the sdist for it, installed
   with the ``dev`` extra into a new virtualenv; the demo test
   (tests/integration/test_cli_demo.py, marked ``release``, which the tiers leave to this
   check) runs ``python -m connectors demo`` from a directory the repository cannot be
   imported from, and every command it prints (the Spark smoke test of that pyspark); then
   the unit suite, against the installed wheel.
3. The highest Python declared, with the pyspark pip picks for it (the highest): the sdist
   installed where no C compiler can be found (``PATH`` holding only the virtualenv, ``CC``
   naming a binary that does not exist): the extensions are skipped, ``doctor`` must name
   each one and the produce path that leaves, and the demo and the unit suite (all but the
   tests marked ``c_extensions``, which assert the extensions' own work) must pass without
   them; then the wheel built for it (with the extensions) and the tests marked
   ``c_extensions``: the whole suite between the two installs.

Each demo runs in a mount namespace of its own (``unshare -m``) whose ``/tmp`` is a fresh
tmpfs, listed when the demo has ended: it must be empty (README, "What a run leaves in
/tmp"; tests/private_tmp.py). Every install comes from the wheelhouse alone
(``--no-index``); what is missing there is fetched into it when the package index answers, so
a registry outage does not fail a machine that ran once before. The pytest runs write JUnit
reports into ``--junit-dir`` (run-tests sums them); each step prints its minutes. The two
legs run at once, their installs taking turns. Exit 0 when every step passed.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tomli
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from connectors.doctor.install import EXTENSIONS as _MODULES  # noqa: E402 - the one table
from tests import private_tmp  # noqa: E402 - the repository's, found through REPO

DIST = "pyspark-exactly-once"

#: The C extensions a wheel must hold, as paths (doctor's table, held to setup.py).
EXTENSIONS = tuple(m.replace(".", "/") for m in _MODULES)
#: The demo as the matrix runs it: small, one SIGKILL, a fixed seed (about a minute).
DEMO = ("demo", "--lines", "2000", "--batch-size", "500", "--kills", "1", "--seed", "50")
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


class Failed(Exception):
    """A step of the check failed; its message says which and why."""


class Skipped(Exception):
    """A leg cannot run on this machine (outside CI only); its message says why."""


#: The leg a thread runs (its lines say which).
_leg = threading.local()


def say(line: str) -> None:
    name = getattr(_leg, "name", None)
    print(f"release-check{f' [{name}]' if name else ''}: {line}", flush=True)


# -- what pyproject.toml declares ------------------------------------------------------------
def declared() -> tuple[list[str], str]:
    """The Python versions of the classifiers, ascending, and the lowest pyspark declared."""
    project = tomli.loads((REPO / "pyproject.toml").read_text())["project"]
    versions = sorted((m.group(1) for c in project.get("classifiers", [])
                       if (m := re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c))),
                      key=lambda v: tuple(map(int, v.split("."))))
    pyspark = next(Requirement(r) for r in project["dependencies"]
                   if Requirement(r).name == "pyspark")
    lowest = next((s.version for s in pyspark.specifier if s.operator == ">="), None)
    if not versions or lowest is None:
        raise Failed("pyproject.toml declares no Python classifiers or no pyspark>= bound")
    return versions, lowest


def interpreter(version: str) -> str:
    """A CPython ``version`` on this machine: ``python3.X`` on PATH (pyenv's shims), else
    pyenv's own directory."""
    candidates = [shutil.which(f"python{version}") or ""]
    candidates += sorted(glob.glob(os.path.expanduser(
        f"~/.pyenv/versions/{version}.*/bin/python{version}")), reverse=True)
    for path in filter(None, candidates):
        done = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip() == version:
            return path
    why = (f"no Python {version} on this machine (python{version} on PATH, or pyenv's "
           f"~/.pyenv/versions/{version}.*): pyproject.toml declares it (pyenv install "
           f"{version})")
    if CI:  # as a missing service: a failure under CI, a skip elsewhere
        raise Failed(why)
    raise Skipped(why)


# -- installs through the wheelhouse ---------------------------------------------------------
def index_answers() -> bool:
    url = (os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/") + "/pip/"
    try:
        urllib.request.urlopen(url, timeout=15).close()  # noqa: S310 - the package index
    except Exception:  # noqa: BLE001 - any failure means: the wheelhouse alone
        return False
    return True


def run(argv: Sequence[str], *, what: str, cwd: Path | None = None,
        env: dict[str, str] | None = None, timeout: float = 900) -> str:
    done = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise Failed(f"{what} failed (exit {done.returncode}):\n"
                     f"{(done.stdout + done.stderr)[-4000:]}")
    return done.stdout + done.stderr


#: One install or wheelhouse fill at a time: a fill writes wheels another install would read.
_WHEELHOUSE = threading.Lock()


def pip_install(python: str, reqs: Sequence[str], wheelhouse: Path, *, what: str,
                env: dict[str, str] | None = None, options: Sequence[str] = ()) -> None:
    """``reqs`` from the wheelhouse alone; what it lacks (a Python not seen before, a new
    dependency) is fetched into it first when the index answers."""
    with _WHEELHOUSE:
        _pip_install(python, reqs, wheelhouse, what=what, env=env, options=options)


def _pip_install(python: str, reqs: Sequence[str], wheelhouse: Path, *, what: str,
                 env: dict[str, str] | None, options: Sequence[str]) -> None:
    argv = [python, "-m", "pip", "install", "-q", "--no-index", "--find-links",
            str(wheelhouse), *options, *reqs]
    try:
        run(argv, what=what, env=env)
        return
    except Failed:
        if not index_answers():
            raise
    say(f"  the wheelhouse lacks something for {what}: fetching it from the package index")
    # --use-pep517: pyspark is an sdist with a setup.py alone, and an older pip (3.10's
    # ensurepip has 23.0) would build it with the virtualenv's own setuptools, which has no
    # bdist_wheel without the wheel package ("invalid command 'bdist_wheel'" on a machine
    # whose wheelhouse did not already hold it); isolated, it gets a setuptools that does.
    run([python, "-m", "pip", "wheel", "-q", "--use-pep517", "-w", str(wheelhouse),
         "--find-links", str(wheelhouse), *reqs], what=f"filling the wheelhouse for {what}")
    for ours in wheelhouse.glob("pyspark_exactly_once-*"):
        ours.unlink()  # the wheelhouse holds dependencies, never this package
    run(argv, what=what, env=env)


def venv(python: str, where: Path) -> str:
    run([python, "-m", "venv", str(where)], what=f"a virtualenv of {python}")
    return str(where / "bin" / "python")


def clean_env(venv_python: str, **extra: str) -> dict[str, str]:
    """The environment of an installed user: the virtualenv first on PATH, nothing that
    points into the repository."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{Path(venv_python).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


# -- the steps -------------------------------------------------------------------------------
def build(wheelhouse: Path, out: Path) -> Path:
    """``python -m build``: the sdist, and the wheel it builds from it for this Python."""
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)}
    run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)],
        what="python -m build", env=env)
    sdist = next(out.glob("pyspark_exactly_once-*.tar.gz"))
    wheel = next(out.glob("pyspark_exactly_once-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    missing = [e for e in EXTENSIONS if not any(n.startswith(e) and n.endswith(".so")
                                                for n in names)]
    missing += [f for f in ("connectors/py.typed", "connectors/demo/services/pom.xml")
                if f not in names]
    if not any(n.endswith(".dist-info/LICENSE") or "/licenses/" in n for n in names):
        missing.append("LICENSE")
    if missing:
        raise Failed(f"{wheel.name} lacks {missing}")
    say(f"  {sdist.name} and {wheel.name} (3 C extensions, py.typed, LICENSE)")
    return sdist


def wheel_for(python: str, sdist: Path, wheelhouse: Path, out: Path) -> Path:
    """The wheel ``python`` builds from the sdist (with the C extensions)."""
    out.mkdir(parents=True, exist_ok=True)
    run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--find-links",
         str(wheelhouse), "-w", str(out), str(sdist)], what=f"the wheel of {sdist.name}")
    return next(out.glob("pyspark_exactly_once-*.whl"))


def versions(python: str, cwd: Path) -> str:
    """Where ``connectors`` imports from (never the repository) and the versions in use."""
    code = ("import connectors, importlib.metadata as m, platform; "
            "print(connectors.__file__); "
            "print('Python', platform.python_version(), '| pyspark', m.version('pyspark'), "
            "'| obstore', m.version('obstore'))")
    out = run([python, "-c", code], what="import connectors", cwd=cwd,
              env=clean_env(python)).splitlines()
    if str(REPO) in out[0] or "site-packages" not in out[0]:
        raise Failed(f"connectors imported from {out[0]}, not the installed package")
    return out[1]


def demo(python: str, cwd: Path) -> str:
    """``python -m connectors demo`` from ``cwd``, in a mount namespace whose /tmp is a fresh
    tmpfs; its last line. What the demo left in that /tmp fails the step."""
    listing = cwd / "tmp-after-demo.txt"
    argv = [python, "-m", "connectors", *DEMO]
    private = private_tmp.available()
    if private:
        argv = private_tmp.wrap(argv, listing)
    elif CI:
        raise Failed("cannot make a mount namespace (unshare -m, as root) to see what the "
                     "demo leaves in /tmp")
    else:
        say("  (no mount namespace here: what the demo leaves in /tmp is not checked)")
    out = run(argv, what="python -m connectors demo", cwd=cwd, env=clean_env(python),
              timeout=1200)
    last = [line for line in out.splitlines() if line.strip()][-6:]
    if not any("RESULT: all sinks exactly-once" in line for line in last):
        raise Failed("the demo did not end with 'all sinks exactly-once':\n" + out[-3000:])
    if private:
        left = private_tmp.left(listing)
        if left:
            raise Failed(f"the demo left in /tmp: {left}")
        say("  /tmp after the demo: empty")
    return next(line for line in last if "RESULT" in line)


def pytest(python: str, cwd: Path, junit: Path, *args: str, **env: str) -> str:
    """pytest against the installed package: from outside the repository, with the
    repository appended to sys.path (its ``tests`` package), never first; its last line."""
    done = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=append",
         f"--rootdir={REPO}", f"--junitxml={junit}", *args],
        cwd=cwd, env=clean_env(python, **env), capture_output=True, text=True, timeout=1800,
        check=False)
    tail = [line for line in done.stdout.splitlines() if line.strip()][-1:] or ["(no output)"]
    if done.returncode != 0:
        raise Failed(f"pytest {' '.join(args)} failed:\n" + done.stdout[-6000:]
                     + done.stderr[-2000:])
    return tail[0]


def unit_suite(python: str, cwd: Path, junit: Path, *args: str) -> str:
    return pytest(python, cwd, junit, "-n", "2", *args, str(REPO / "tests" / "unit"))


def doctor_without_compiler(python: str, cwd: Path) -> str:
    out = run([python, "-m", "connectors", "doctor"], what="doctor", cwd=cwd,
              env=clean_env(python))
    for module in ("_record_batch", "_keyed_produce", "_avro_decode"):
        if f"warn  C extension {module}: not built" not in out:
            raise Failed(f"doctor does not say that {module} is not built:\n{out}")
    if "warn  Kafka sink produce path: librdkafka, not the wire path" not in out:
        raise Failed(f"doctor does not name the produce path left without them:\n{out}")
    return out


class Leg:
    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.root = root
        self.began = time.monotonic()
        _leg.name = name
        root.mkdir(parents=True)

    def step(self, what: str) -> None:
        say(f"{what} ({(time.monotonic() - self.began) / 60:.1f} min so far)")

    def done(self) -> float:
        return (time.monotonic() - self.began) / 60


def lowest_leg(version: str, pyspark: str, sdist: Path, wheelhouse: Path, root: Path,
               junit_dir: Path) -> None:
    leg = Leg(f"Python {version}, pyspark {pyspark}", root)
    python = interpreter(version)
    work = root / "work"
    work.mkdir()
    leg.step(f"a wheel from the sdist with {python}")
    wheel = wheel_for(python, sdist, wheelhouse, root / "dist")
    leg.step(f"{wheel.name}[dev] into a new virtualenv, pyspark=={pyspark}")
    py = venv(python, root / "venv")
    pins = [f"pyspark=={pyspark}"]
    pip_install(py, [f"{wheel}[dev]", *pins], wheelhouse, what=f"{wheel.name}[dev]")
    say(f"  {versions(py, work)}")
    leg.step("the demo test: python -m connectors demo from a directory without the "
             "repository, every command it prints, its /tmp")
    say("  demo test: " + pytest(py, work, junit_dir / f"demo-py{version}.xml", "-m", "release",
                                 str(REPO / "tests" / "integration" / "test_cli_demo.py"),
                                 EO_TEST_INSTALLED="1"))
    leg.step("the unit suite against the installed wheel")
    say(f"  unit suite: {unit_suite(py, work, junit_dir / f'unit-py{version}.xml')}")
    say(f"passed in {leg.done():.1f} min")


def highest_leg(version: str, sdist: Path, wheelhouse: Path, root: Path,
                junit_dir: Path) -> None:
    leg = Leg(f"Python {version}", root)
    python = interpreter(version)
    work = root / "work"
    work.mkdir()
    py = venv(python, root / "venv")
    leg.step(f"{sdist.name}[demo,dev] with no C compiler (PATH: the virtualenv only, CC "
             "missing)")
    nocc = {**clean_env(py), "PATH": str(Path(py).parent), "CC": "/nonexistent/cc",
            "CXX": "/nonexistent/c++", "LDSHARED": "/nonexistent/cc -shared"}
    # --no-cache-dir: never a wheel pip built from this sdist before, with a compiler
    pip_install(py, [f"{sdist}[demo,dev]"], wheelhouse, what=f"{sdist.name} without a compiler",
                env=nocc, options=("--no-cache-dir",))
    say(f"  {versions(py, work)}")
    out = doctor_without_compiler(py, work)
    say("  doctor without a compiler:\n" + "\n".join(
        "    " + line for line in out.splitlines() if line.strip()))
    leg.step("python -m connectors demo without the C extensions")
    say(f"  demo: {demo(py, work)}")
    leg.step("the unit suite without the C extensions (all but the tests marked c_extensions)")
    say("  unit suite without the C extensions: " + unit_suite(
        py, work, junit_dir / f"unit-py{version}-no-extensions.xml", "-m", "not c_extensions"))
    leg.step("the wheel built with the C extensions, the dev extra, then the tests marked "
             "c_extensions")
    wheel = wheel_for(python, sdist, wheelhouse, root / "dist")
    pip_install(py, [str(wheel)], wheelhouse, what=wheel.name,
                options=("--force-reinstall", "--no-deps"))
    pip_install(py, [f"{wheel}[dev]"], wheelhouse, what=f"{wheel.name}[dev]")
    out = run([py, "-m", "connectors", "doctor"], what="doctor with the extensions", cwd=work,
              env=clean_env(py))
    if "not built" in out:
        raise Failed(f"doctor after installing {wheel.name}:\n{out}")
    say("  the tests marked c_extensions: " + unit_suite(
        py, work, junit_dir / f"unit-py{version}.xml", "-m", "c_extensions"))
    say(f"passed in {leg.done():.1f} min")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheelhouse", type=Path, default=Path(os.environ.get(
        "EO_WHEELHOUSE", Path.home() / ".cache" / "eo-connectors" / "wheels")))
    p.add_argument("--junit-dir", type=Path, default=None,
                   help="where the unit suites write their JUnit reports")
    p.add_argument("--keep", action="store_true", help="keep the virtualenvs and builds")
    p.add_argument("--serial", action="store_true", help="one leg after the other")
    args = p.parse_args(argv)
    began = time.monotonic()
    # not under /tmp: each demo gets a /tmp of its own, where this would be hidden
    root = Path(tempfile.mkdtemp(prefix="eo-release-check-",
                                 dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    junit = args.junit_dir or root / "junit"
    junit.mkdir(parents=True, exist_ok=True)
    failed = []
    try:
        pythons, pyspark = declared()
        say(f"declared: Python {pythons[0]} to {pythons[-1]}, pyspark>={pyspark}")
        say("python -m build")
        sdist = build(args.wheelhouse, root / "dist")
        legs = [("lowest", lambda: lowest_leg(pythons[0], pyspark, sdist, args.wheelhouse,
                                              root / "lowest", junit)),
                ("highest", lambda: highest_leg(pythons[-1], sdist, args.wheelhouse,
                                                root / "highest", junit))]
        # Both legs at once (--serial: one after the other): their installs take turns
        # (_WHEELHOUSE), their demos and unit suites share the two cores.
        def one(name: str, leg: Callable[[], None]) -> None:
            try:
                leg()
            except Skipped as e:
                say(f"SKIPPED ({name} Python): {e}")
            except Failed as e:
                failed.append(name)
                say(f"FAILED ({name} Python): {e}")
            except Exception as e:  # noqa: BLE001 - a bug of this script fails its leg
                failed.append(name)
                say(f"FAILED ({name} Python): {type(e).__name__}: {e}")

        if args.serial:
            for name, leg in legs:
                one(name, leg)
        else:
            with ThreadPoolExecutor(len(legs)) as pool:
                for future in [pool.submit(one, name, leg) for name, leg in legs]:
                    future.result()
    except Failed as e:
        failed.append("build")
        say(f"FAILED: {e}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    minutes = (time.monotonic() - began) / 60
    say(f"{'passed' if not failed else 'FAILED: ' + ', '.join(failed)} in {minutes:.1f} min")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
