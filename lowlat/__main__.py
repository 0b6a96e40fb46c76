"""`python -m lowlat ...`: the `lowlat` command line (lowlat/cli.py)."""

from lowlat.cli import main

raise SystemExit(main())
