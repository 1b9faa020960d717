import sys

from ftsup.supervisor.main import main

sys.exit(main())
