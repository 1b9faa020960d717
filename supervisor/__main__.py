import sys

from supervisor.main import main

sys.exit(main())
