"""`ftsup run`'s command line (issue 13): torchrun's flags accepted or refused by name, and the
job file it builds is one the supervisor loads into the JobSpec a production job file would."""

from __future__ import annotations

import io
import json
import pathlib

import pytest

from ftsup.harness.rank_output import RankOutput
from ftsup.harness.run_args import (
    DEFAULT_MAX_RESTARTS,
    REFUSED,
    RunUsageError,
    job_dict,
    parse,
)
from ftsup.supervisor.config import load_job


def test_torchruns_launch_flags_in_both_spellings_build_the_run():
    spec = parse(["--nproc_per_node", "2", "--standalone", "--max-restarts", "1", "--master-port", "29400",
                  "--log_dir", "/tmp/l", "--tee", "3", "train.py", "--lr", "0.1", "--nnodes", "9"], python="py")
    assert (spec.nnodes, spec.nproc_per_node, spec.max_restarts, spec.master_port, spec.log_dir) == \
        (1, 2, 1, 29400, "/tmp/l")
    assert spec.argv == ("py", "train.py", "--lr", "0.1", "--nnodes", "9")  # the script's own flags stay its own
    assert parse(["-m", "pkg.train"], python="py").argv == ("py", "-m", "pkg.train")
    assert parse(["--no-python", "./train.sh"]).argv == ("./train.sh",)
    assert parse(["t.py"]).max_restarts == DEFAULT_MAX_RESTARTS


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_each_refused_torchrun_flag_is_named_with_its_reason(flag):
    with pytest.raises(RunUsageError) as refused:
        parse([f"--{flag}", "x", "t.py"])
    assert f"--{flag}" in str(refused.value) and REFUSED[flag] in str(refused.value)


@pytest.mark.parametrize(("argv", "says"), [
    (["--nnodes", "2", "t.py"], "see docs/run.md"),
    (["--nnodes", "1:4", "t.py"], "min_nodes"),
    (["--node-rank", "1", "t.py"], "one machine"),
    (["--master-addr", "10.0.0.5", "t.py"], "one machine"),
    (["--spares", "1", "t.py"], "--local-nodes"),
    (["--nproc-per-node", "gpu", "t.py"], "whole number"),
    (["--max-restarts", "-1", "t.py"], "--max-restarts"),
    (["--bogus", "t.py"], "--bogus"),
])
def test_what_cannot_run_here_is_refused_with_the_reason(argv, says):
    with pytest.raises(RunUsageError) as refused:
        parse(argv)
    assert says in str(refused.value)


def test_the_run_is_the_job_file_a_production_job_uses(tmp_path):
    spec = parse(["--nnodes", "2", "--local-nodes", "--nproc-per-node", "4", "--max-restarts", "5",
                  "--sigterm-grace-s", "30", "--master-port", "29400", "--job-name", "gpt", "t.py", "--x"],
                 python="py")
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job_dict(spec, "/srv/train")))
    job = load_job(path)
    assert (job.name, job.nodes, job.ranks_per_node, job.argv) == ("gpt", 2, 4, ("py", "t.py", "--x"))
    assert (job.cwd, job.max_restarts, job.sigterm_grace_s) == ("/srv/train", 5, 30.0)
    assert (job.master_port_base, job.master_port_span) == (29400, 1)


def test_a_job_file_without_a_budget_restarts_without_limit_and_rejects_bad_keys(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"nodes": 1, "argv": ["t"]}))
    job = load_job(path)
    assert (job.max_restarts, job.sigterm_grace_s, job.cwd) == (None, 3.0, "")
    for bad in ({"max_restarts": "3"}, {"max_restarts": -1}, {"sigterm_grace_s": 1e9}, {"cwd": 7}):
        path.write_text(json.dumps({"nodes": 1, "argv": ["t"], **bad}))
        with pytest.raises(ValueError, match=next(iter(bad))):
            load_job(path)


def test_rank_output_prefixes_whole_lines_and_keeps_per_rank_copies(tmp_path):
    node = tmp_path / "nodes" / "node-1"
    node.mkdir(parents=True)
    out = io.StringIO()
    follower = RankOutput(tmp_path / "nodes", out, tmp_path / "logs")
    (node / "rank-1.gen-2.log").write_bytes(b"hello\npart")
    (node / "agent.log").write_text("not a rank\n")
    assert follower.poll() == 1
    with open(node / "rank-1.gen-2.log", "ab") as log:
        log.write(b"ial line\nlast")
    follower.poll()
    follower.finish()
    assert out.getvalue() == "[rank 1]:hello\n[rank 1]:partial line\n[rank 1]:last\n"
    assert pathlib.Path(tmp_path / "logs" / "rank-1.gen-2.log").read_text() == "hello\npartial line\nlast\n"
