"""``python -m flashkit.cli``: the same command as ``flashkit``."""

import sys

from flashkit.cli.main import main

sys.exit(main())
