"""`python -m akorun ...`: the same as the `akorun` console script."""

import sys

from akorun.launching.commands import main

sys.exit(main())
