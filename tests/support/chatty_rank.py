"""A level-0 script that prints a line, waits for a go file, prints another and exits 0.

For `supervisorctl logs`: the first line is there to be read back, the second is printed only
once the test says so (after its follow is attached), so it can only arrive through the follow.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time


def main() -> None:
    rank = os.environ["RANK"]
    print(f"hello from rank {rank}", flush=True)
    go = pathlib.Path(sys.argv[1])
    deadline = time.monotonic() + 120.0
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"later line from rank {rank}", flush=True)


if __name__ == "__main__":
    main()
