"""python -m dequantd ...: see dequantd.cli."""

from .cli import main

raise SystemExit(main())
