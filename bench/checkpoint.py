"""Sharded checkpoint commit throughput to S3 vs a plain parallel boto3 upload of the same bytes.

`ranks` processes (gloo) each hold a 1/ranks shard of DTensors (`mb_per_rank` MB per rank, ~1 GB
in all by default) and save them through trainer.checkpoint (DCP -> ObjectStoreWriter -> S3Store,
parts in parallel with SHA-256 checksums, shard indexes, rank 0 verifies every object and writes the
manifest): `commit_mbps` is bytes / (barrier-to-barrier time of the whole save and commit). The
baseline, in the same processes and run: each rank uploads the same bytes as one object with
boto3's `upload_fileobj` (TransferConfig with the same part size and thread count, default
checksums): `raw_mbps`. Rounds alternate the order; the medians are reported. The S3 endpoint is
a local SeaweedFS started here (data on disk) unless --endpoint is given (credentials from the
environment). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass

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

    commit_s, raw_s = [], []
    for r in range(plan.rounds):
        cid = checkpoint_id_for(r + 1, uuid.uuid4().hex[:8]) if rank == 0 else ""
        box = [cid]
        dist.broadcast_object_list(box, src=0)
        cid = box[0]

        def run_commit(cid: str = cid, r: int = r) -> None:
            flows.save(state, store, layout, cid, r + 1, topology, versions)

        def run_raw(r: int = r) -> None:
            client.upload_fileobj(io.BytesIO(raw), plan.bucket, f"{plan.prefix}/raw/{r}/rank{rank}", Config=transfer)

        order = (("raw", run_raw), ("commit", run_commit)) if r % 2 == 0 else (("commit", run_commit), ("raw", run_raw))
        for name, fn in order:
            (raw_s if name == "raw" else commit_s).append(timed(fn))
    if rank == 0:
        committed = catalog.list_committed(store, layout)
        result = {"commit_s": commit_s, "raw_s": raw_s, "committed": len(committed),
                  "bytes_per_rank": len(raw), "objects_per_checkpoint": len(committed[-1].objects)}
        pathlib.Path(plan.out).write_text(json.dumps(result))
    store.close()
    dist.barrier()
    dist.destroy_process_group()


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
    parser.add_argument("--quick", action="store_true", help="4 ranks x 16 MB, 1 round: a smoke run")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the output is always JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.mb_per_rank, args.rounds = 16, 1
    if args.ranks < 1 or args.mb_per_rank < 1 or args.threads < 1 or args.rounds < 1 or args.part_mib < 5:
        parser.error("need --ranks, --mb-per-rank, --threads, --rounds >= 1 and --part-mib >= 5")
    if args.endpoint and not args.bucket:
        parser.error("--endpoint needs --bucket")

    import torch.multiprocessing as mp

    from tests.support.s3_server import S3Server

    work = pathlib.Path(tempfile.mkdtemp(prefix="ftsup-bench-ckpt-", dir=args.dir))
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
                    args.region, f"bench-{uuid.uuid4().hex[:8]}", str(work / "result.json"), str(work / "init"))
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
