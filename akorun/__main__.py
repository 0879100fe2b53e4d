"""`python -m akorun ...`: the same as the `akorun` console script."""

import sys

from akorun.launch.commands import main

sys.exit(main())
