"""Sharded checkpoint commit throughput to S3 vs a plain parallel boto3 upload of the same bytes.

`ranks` processes (gloo) each hold a 1/ranks shard of DTensors (`mb_per_rank` MB per rank, ~1 GB
in all by default) and save them through trainer.checkpoint (DCP -> ObjectStoreWriter -> S3Store,
parts in parallel with SHA-256 checksums, shard indexes, rank 0 verifies every object and writes the
manifest): `commit_mbps` is bytes / (barrier-to-barrier time of the whole save and commit). The
baseline, in the same processes and run: each rank uploads the same bytes as one object with
boto3's `upload_fileobj` (TransferConfig with the same part size and thread count, default
checksums): `raw_mbps`. The peer, in the same processes and run: `s3torchconnector`'s DCP writer
(`dcp.save(state, storage_writer=S3StorageWriter(...))`, the same part size and thread count), its
time to a committed checkpoint (DCP's `.metadata` written) and `s3tc_mbps`; when the package is
missing (it is in the bench-peers extra) the ranks run under the peers' venv's python, and
without either the JSON says why it was not measured. Rounds rotate the order; the medians are
reported. The S3 endpoint is a local SeaweedFS started here (data on disk) unless --endpoint is
given (credentials from the environment). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass

from ftsup.bench import arguments
from ftsup.harness import orphan_guard

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MB = 1_000_000


@dataclass(frozen=True)
class Plan:
    ranks: int
    mb_per_rank: int
    threads: int
    part_mib: int
    rounds: int
    bucket: str
    endpoint_url: str | None
    region: str | None
    prefix: str
    out: str
    init_file: str
    s3tc: bool  # also time s3torchconnector's S3StorageWriter


def _rank_main(rank: int, plan: Plan) -> None:
    import boto3
    import torch
    import torch.distributed as dist
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from ftsup.checkpoint import catalog, flows
    from ftsup.checkpoint.digest import MIB, Chunking
    from ftsup.checkpoint.manifest import Layout, Topology, Versions, checkpoint_id_for
    from ftsup.checkpoint.s3 import S3Config, S3Store

    dist.init_process_group("gloo", init_method=f"file://{plan.init_file}", rank=rank, world_size=plan.ranks)
    mesh = init_device_mesh("cpu", (plan.ranks,))
    # 8 DTensors sharded on dim 0: each rank holds mb_per_rank MB of float32.
    rows_per_rank = plan.mb_per_rank * MB // 4 // 8 // 1024
    gen = torch.Generator().manual_seed(rank)
    state = {}
    for i in range(8):
        local = torch.randn(rows_per_rank, 1024, generator=gen)
        state[f"layer{i}.weight"] = DTensor.from_local(local, mesh, [Shard(0)])
    raw = b"".join(t.to_local().numpy().tobytes() for t in state.values())
    chunking = Chunking(multipart_threshold_bytes=plan.part_mib * MIB, part_size_bytes=plan.part_mib * MIB)
    store = S3Store(S3Config(bucket=plan.bucket, endpoint_url=plan.endpoint_url, region=plan.region,
                             chunking=chunking, max_concurrency=plan.threads))
    client = boto3.session.Session().client("s3", endpoint_url=plan.endpoint_url, region_name=plan.region,
                                            config=Config(max_pool_connections=plan.threads + 4))
    transfer = TransferConfig(multipart_threshold=plan.part_mib * MIB, multipart_chunksize=plan.part_mib * MIB,
                              max_concurrency=plan.threads, use_threads=True)
    layout = Layout(plan.prefix)
    topology = Topology(plan.ranks, plan.ranks)
    versions = Versions("bench-data", "bench-tok")

    def timed(fn) -> float:
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - start

    def run_s3tc(r: int) -> None:
        import torch.distributed.checkpoint as dcp
        from s3torchconnector import S3ClientConfig
        from s3torchconnector.dcp import S3StorageWriter

        # Its native client takes a custom endpoint only from AWS_ENDPOINT_URL; path-style
        # addressing as for every local S3 server (virtual hosts need DNS for each bucket).
        if plan.endpoint_url:
            os.environ["AWS_ENDPOINT_URL"] = plan.endpoint_url
        config = S3ClientConfig(part_size=plan.part_mib * MIB, force_path_style=True)
        writer = S3StorageWriter(plan.region or "us-east-1", f"s3://{plan.bucket}/{plan.prefix}/s3tc/{r}",
                                 s3client_config=config, thread_count=plan.threads)
        dcp.save(state, storage_writer=writer)

    commit_s: list[float] = []
    raw_s: list[float] = []
    s3tc_s: list[float] = []
    s3tc_error = None
    for r in range(plan.rounds):
        cid = checkpoint_id_for(r + 1, uuid.uuid4().hex[:8]) if rank == 0 else ""
        box = [cid]
        dist.broadcast_object_list(box, src=0)
        cid = box[0]

        def run_commit(cid: str = cid, r: int = r) -> None:
            flows.save(state, store, layout, cid, r + 1, topology, versions)

        def run_raw(r: int = r) -> None:
            client.upload_fileobj(io.BytesIO(raw), plan.bucket, f"{plan.prefix}/raw/{r}/rank{rank}", Config=transfer)

        def run_peer(r: int = r) -> None:
            nonlocal s3tc_error
            try:
                run_s3tc(r)
            except Exception as exc:  # DCP raises on every rank when one fails: all stop timing it
                s3tc_error = f"{type(exc).__name__}: {exc}"[:500]

        steps = [("raw", run_raw, raw_s), ("commit", run_commit, commit_s)]
        if plan.s3tc and s3tc_error is None:
            steps.append(("s3tc", run_peer, s3tc_s))
        for _name, fn, times in steps[r % len(steps):] + steps[:r % len(steps)]:
            times.append(timed(fn))
    if s3tc_error is not None:
        s3tc_s.clear()
    if rank == 0:
        committed = catalog.list_committed(store, layout)
        result = {"commit_s": commit_s, "raw_s": raw_s, "committed": len(committed),
                  "bytes_per_rank": len(raw), "objects_per_checkpoint": len(committed[-1].objects),
                  "s3tc_s": s3tc_s, "s3tc_error": s3tc_error}
        if s3tc_s:  # committed = DCP's .metadata is there (the coordinator writes it last)
            listed = client.list_objects_v2(Bucket=plan.bucket, Prefix=f"{plan.prefix}/s3tc/")
            keys = [o["Key"] for o in listed.get("Contents", [])]
            result["s3tc_committed"] = sum(key.endswith("/.metadata") for key in keys)
            result["s3tc_objects_per_checkpoint"] = len(keys) // plan.rounds
        pathlib.Path(plan.out).write_text(json.dumps(result))
    store.close()
    dist.barrier()
    dist.destroy_process_group()


S3TC_CHECK = "import s3torchconnector.dcp, s3torchconnector; print(s3torchconnector.__version__)"


def s3tc_python(peers_python: pathlib.Path | None) -> tuple[str | None, str, str]:
    """The python whose ranks can run s3torchconnector's writer: (python or None, version, why not).

    This one if it has the package; else the peers' venv (--peers-python, default .venv-peers
    beside ours); else None and the reason, which the JSON carries.
    """
    candidates = [pathlib.Path(sys.executable)]
    default = pathlib.Path(sys.prefix).parent / ".venv-peers" / "bin" / "python"
    if peers_python is not None:
        candidates.append(peers_python)
    elif default.exists():
        candidates.append(default)
    errors = []
    for python in candidates:
        done = subprocess.run([str(python), "-c", S3TC_CHECK], capture_output=True, text=True, check=False, timeout=120)
        if done.returncode == 0:
            return str(python), done.stdout.strip().splitlines()[-1], ""
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        errors.append(f"{python}: {last}")
    return None, "", ("not installed (the bench-peers extra; docs/peers.md): " + "; ".join(errors))


def s3tc_summary(measured: dict, total: int, commit_s: float, python: str | None, version: str,
                 why_not: str) -> dict:
    """s3torchconnector's figures beside ftsup's commit (ratio > 1: ftsup commits faster)."""
    if python is None:
        return {"ran": False, "reason": why_not}
    if measured.get("s3tc_error") or not measured.get("s3tc_s"):
        return {"ran": False, "reason": f"its save failed: {measured.get('s3tc_error') or 'no timing'}"}
    s3tc_s = statistics.median(measured["s3tc_s"])
    return {
        "ran": True, "version": version, "python": python,
        "config": "dcp.save(state, storage_writer=S3StorageWriter(region, s3://bucket/prefix, "
                  "S3ClientConfig(part_size=--part-mib, force_path_style=True), thread_count=--threads)), "
                  "AWS_ENDPOINT_URL for the local server",
        "committed_s": round(s3tc_s, 3), "mbps": round(total / MB / s3tc_s, 1),
        "committed_s_rounds": [round(x, 3) for x in measured["s3tc_s"]],
        "checkpoints_committed": measured.get("s3tc_committed", 0),
        "objects_per_checkpoint": measured.get("s3tc_objects_per_checkpoint", 0),
        "ftsup_committed_s": round(commit_s, 3),
        "ftsup_speedup": round(s3tc_s / commit_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup bench checkpoint", description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mb-per-rank", type=int, default=256)
    parser.add_argument("--threads", type=int, default=4, help="upload threads per rank, both sides")
    parser.add_argument("--part-mib", type=int, default=16, help="multipart part size, both sides")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--endpoint", default=None, help="S3 endpoint URL; default: start a local SeaweedFS")
    parser.add_argument("--bucket", default=None, help="with --endpoint: an existing bucket")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--dir", default=None, help="where the local server keeps its data (default: a temp dir on disk)")
    parser.add_argument("--peers-python", type=pathlib.Path, default=None,
                        help="python of the venv with the bench-peers extra, for s3torchconnector when this one "
                             "lacks it (default: .venv-peers/bin/python beside ours)")
    parser.add_argument("--no-peers", action="store_true", help="skip s3torchconnector's writer")
    parser.add_argument("--quick", action="store_true", help="4 ranks x 16 MB, 1 round: a smoke run")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the output is always JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.mb_per_rank, args.rounds = 16, 1
    if args.ranks < 1 or args.mb_per_rank < 1 or args.threads < 1 or args.rounds < 1 or args.part_mib < 5:
        parser.error("need --ranks, --mb-per-rank, --threads, --rounds >= 1 and --part-mib >= 5")
    if args.endpoint and not args.bucket:
        parser.error("--endpoint needs --bucket")
    if args.peers_python is not None and not args.peers_python.exists():
        parser.error(f"--peers-python {args.peers_python} does not exist (docs/peers.md says how to make the peers' venv)")
    rank_python, s3tc_version, s3tc_why_not = (None, "", "--no-peers") if args.no_peers else s3tc_python(args.peers_python)
    if rank_python is not None and rank_python != sys.executable:
        # The whole bench runs under the peers' venv's python (the same interpreter and tree, with
        # the extra installed), so that all three writers are timed in the same rank processes on
        # the same tensors (a spawned child takes its parent's sys.path, not its interpreter's).
        print(f"ftsup bench checkpoint: running under {rank_python} (it has s3torchconnector)", file=sys.stderr)
        from ftsup.harness.cluster import terminate_group

        # Through the CLI, so that a stop passed on (SIGTERM) unwinds it too: its S3 server and ranks stop.
        child = subprocess.Popen([rank_python, "-m", "ftsup.harness.cli", "bench", "checkpoint",
                                  *(sys.argv[1:] if argv is None else argv)], stdout=subprocess.PIPE,
                                 start_new_session=True)
        orphan_guard.watch(child)
        try:
            out, _ = child.communicate()
        except BaseException:
            terminate_group(child, grace_s=30.0)
            raise
        sys.stdout.write(out.decode(errors="replace"))
        sys.stdout.flush()
        return child.returncode

    import torch.multiprocessing as mp

    from tests.support.s3_server import S3Server

    work = arguments.run_directory("ftsup-bench-ckpt-", args.dir)
    server = None
    try:
        if args.endpoint is None:
            server = S3Server(work / "s3", go_mem_limit="4GiB")
            server.start()
            os.environ.update(server.env())
            endpoint, bucket = server.endpoint_url, server.bucket
        else:
            endpoint, bucket = args.endpoint, args.bucket
        plan = Plan(args.ranks, args.mb_per_rank, args.threads, args.part_mib, args.rounds, bucket, endpoint,
                    args.region, f"bench-{uuid.uuid4().hex[:8]}", str(work / "result.json"), str(work / "init"),
                    s3tc=rank_python is not None)
        mp.spawn(_rank_main, args=(plan,), nprocs=args.ranks, join=True)
        measured = json.loads(pathlib.Path(plan.out).read_text())
    finally:
        if server is not None:
            server.close()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    total = measured["bytes_per_rank"] * args.ranks
    commit_s, raw_s = statistics.median(measured["commit_s"]), statistics.median(measured["raw_s"])
    commit_mbps, raw_mbps = total / MB / commit_s, total / MB / raw_s
    print(json.dumps({
        "s3torchconnector": s3tc_summary(measured, total, commit_s, rank_python, s3tc_version, s3tc_why_not),
        "commit_mbps": round(commit_mbps, 1), "raw_mbps": round(raw_mbps, 1),
        "throughput_ratio": round(commit_mbps / raw_mbps, 3), "goal_ratio": 0.8,
        "bytes_total": total, "commit_s_rounds": [round(s, 3) for s in measured["commit_s"]],
        "raw_s_rounds": [round(s, 3) for s in measured["raw_s"]],
        "checkpoints_committed": measured["committed"], "objects_per_checkpoint": measured["objects_per_checkpoint"],
        "config": {**{k: v for k, v in asdict(plan).items() if k in ("ranks", "mb_per_rank", "threads", "part_mib", "rounds")},
                   "endpoint": "local SeaweedFS (weed mini)" if server is not None else "external",
                   "cpu_count": os.cpu_count()},
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
