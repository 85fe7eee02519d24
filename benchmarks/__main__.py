"""`python -m benchmarks`: see benchmarks.cli."""

from benchmarks.cli import main

raise SystemExit(main())
