"""``python -m connectors``: the operator CLI and the demo."""

import sys

from connectors.cli import main

sys.exit(main(prog="python -m connectors"))
