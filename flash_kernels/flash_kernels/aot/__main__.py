"""``python -m flash_kernels.aot``: the command line of cli.py (options and coverage: the package docstring)."""

import sys

from .cli import main

sys.exit(main())
