"""Writes the variables its launcher added (those not in the parent's environment) and its argv,
one JSON file per rank: `env_dump.py PARENT_KEYS_JSON OUT_DIR`. Used to compare torchrun and
`ftsup run` (tests/integration/test_ftsup_run.py)."""

import json
import os
import pathlib
import sys

parent = set(json.loads(pathlib.Path(sys.argv[1]).read_text()))
out = pathlib.Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
added = {k: v for k, v in os.environ.items() if k not in parent}
added["argv"] = sys.argv[1:-1]  # the output directory differs between the two runs
(out / f"rank-{os.environ['RANK']}.json").write_text(json.dumps(added, sort_keys=True))
