import sys

from dispatchtune.cli import main

sys.exit(main())
