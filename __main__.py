"""`python -m dispatchtune`: the `dispatchtune` command line."""

import sys

from dispatchtune.cli import main

sys.exit(main())
