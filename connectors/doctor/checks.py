"""One line of ``eo-connectors doctor``'s report (:class:`Check`) and its statuses: shared by
the package's checks (install.py, cluster.py) and the report they make up (__init__.py)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"


@dataclass
class Check:
    """One line of the report: ``status`` ok, warn (works, slower or limited), FAIL
    (cannot work as asked) or skip (cannot be checked read-only); ``todo``: what to do."""

    area: str
    name: str
    status: str
    found: str
    todo: str = ""

    def line(self, width: int = 100) -> str:
        text = textwrap.fill(f"{self.status:<4}  {self.name}: {self.found}", width,
                             initial_indent="  ", subsequent_indent=" " * 8)
        if self.todo:
            text += "\n" + textwrap.fill(f"-> {self.todo}", width, initial_indent=" " * 8,
                                         subsequent_indent=" " * 11)
        return text
