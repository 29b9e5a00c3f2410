"""`python -m attnres` runs the command line."""

import sys

from attnres.cli import main

sys.exit(main())
