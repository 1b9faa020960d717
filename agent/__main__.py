"""`python -m agent`: the same entry point as `ftsup agent`."""

import sys

from agent.main import main

sys.exit(main())
