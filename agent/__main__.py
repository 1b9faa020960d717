"""`python -m ftsup.agent`: the same entry point as `ftsup agent`."""

import sys

from ftsup.agent.main import main

sys.exit(main())
