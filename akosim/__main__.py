"""python -m akosim: the same as the akosim command."""

from akosim.cli import main

raise SystemExit(main())
