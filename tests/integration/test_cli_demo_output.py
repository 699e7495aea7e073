"""The demo's console, as a new user's first run into a pipe or a CI log (issue 36, item 6):
it says what it is doing before each long wait (resolving the broker's jars, starting the
broker, producing, starting Spark), writes plain lines instead of carriage-return frames,
and no raw librdkafka line (``%4|...|GETPID|...``) reaches stdout or stderr."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

from tests.helpers import REPO


def test_the_demo_says_what_it_does_in_plain_lines(tmp_path: Any) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "connectors", "demo", "--workdir", str(tmp_path / "demo"),
         "--kills", "1", "--lines", "2000", "--batch-size", "500", "--seed", "36"],
        capture_output=True, text=True, cwd=REPO, timeout=900,
        env={**os.environ, "PYTHONPATH": REPO}, check=False)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "\r" not in out and "\r" not in err
    raw = [line for line in (out + err).splitlines() if re.match(r"%\d\|", line)]
    assert raw == [], raw
    steps = ["resolving Apache Kafka's jars", "starting a local Kafka broker", "Apache Kafka ",
             "producing 2000 lines", "produced 2000/2000 lines",
             "the pipeline runs Spark in a child process", "run 1: pipeline with",
             "final run: restart from the checkpoint", "RESULT: all sinks exactly-once"]
    at = [out.find(s) for s in steps]
    assert -1 not in at and at == sorted(at), dict(zip(steps, at, strict=True))
