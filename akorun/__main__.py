"""`python -m akorun ...`: the same as the `akorun` console script."""

import sys

from akorun.cli import main

sys.exit(main())
