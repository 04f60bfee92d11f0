"""``python -m flashkit.doctor``: the doctor alone, for hosts without the CLI's other dependencies."""

import sys

from flashkit.cli.doctor_cmd import main

sys.exit(main())
