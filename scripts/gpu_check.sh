#!/usr/bin/env bash
# The CUDA/NCCL checks, on a machine with a GPU (CI has none): run from the repository root.
#
#   scripts/gpu_check.sh [OUT_DIR]      (default: $OUT, else ./gpu-check)
#
# Uses `python3` (or $PYTHON) with a CUDA build of torch. If ftsup is not installed there, it is
# put on PYTHONPATH from this checkout (a link farm of the `ftsup.` layout), and wheels in .whl/
# (the daemons' dependencies for that python, and torchdata for the FSDP2 test's ranks) are
# installed into a scratch target first; env.txt names any module still missing. Writes,
# one file per step: env.txt, pytest.txt (tests/integration/test_cuda_paths.py),
# digest_throughput.json, nccl_one_gpu_two_ranks.txt, bench_snapshot_cuda.json (+ .log).
# Each step has its own time limit; a failing step is recorded and the next one still runs.
# GPU_CHECK_K: a pytest -k filter for the tests; GPU_CHECK_STATE_MB: the snapshot bench's state (2000);
# GPU_CHECK_PEERS="name ...": only those peers' snapshot baselines (bench/_snapshot_peers.py), nothing else.
set -u
out=${1:-${OUT:-gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
root=$(pwd)
export PYTHONUNBUFFERED=1 GRPC_VERBOSITY=ERROR

if ! "$py" -c "import ftsup.trainer" 2>/dev/null; then
    if [ -d .whl ]; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ftsup-site .whl/*.whl \
            || { echo "installing .whl/ failed" >&2; exit 1; }
    fi
    farm=/tmp/ftsup-farm/ftsup
    rm -rf /tmp/ftsup-farm && mkdir -p "$farm"
    for entry in proto/ftsup/*; do ln -s "$root/$entry" "$farm/"; done
    for package in supervisor agent trainer common checkpoint harness bench; do ln -s "$root/$package" "$farm/$package"; done
    export PYTHONPATH=/tmp/ftsup-farm:/tmp/ftsup-site${PYTHONPATH:+:$PYTHONPATH}
fi

step() {  # step NAME SECONDS COMMAND...: runs it, records its exit status
    local name=$1 limit=$2; shift 2
    local started=$SECONDS
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    echo "$name rc=$rc in $((SECONDS - started)) s" >>"$out/steps.txt"  # not to stdout: callers redirect it
}

{
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'
    "$py" -c 'import ftsup.trainer.session, grpc, google.protobuf; print("ftsup importable; grpc", grpc.__version__,
"protobuf", google.protobuf.__version__)'
    "$py" -c 'import importlib
def absent(name):
    try:
        importlib.import_module(name)
    except ImportError:
        return True
    return False
missing = [m for m in ("grpc", "google.protobuf", "structlog", "aetcd", "boto3", "torchdata") if absent(m)]
print("missing modules (bring them as wheels in .whl/):", ", ".join(missing) if missing else "none")'
    nproc; free -g | head -2
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

if [ -n "${GPU_CHECK_PEERS:-}" ]; then  # only these peers' snapshot baselines, each alone (e.g. "nvrx_local")
    for name in $GPU_CHECK_PEERS; do
        step "peer_$name" 120 "$py" -m ftsup.bench._snapshot_peers --baseline "$name" --device cuda \
            --state-mb "${GPU_CHECK_STATE_MB:-2000}" --saves 3 --dir "$(mktemp -d)" >"$out/peer_$name.json" 2>"$out/peer_$name.log"
        tail -c 1500 "$out/peer_$name.json"
    done
    cat "$out/steps.txt"
    exit 0
fi

step pytest 240 "$py" -m pytest -p no:cacheprovider -q -rA --durations=0 ${GPU_CHECK_K:+-k "$GPU_CHECK_K"} \
    tests/integration/test_cuda_paths.py >"$out/pytest.txt" 2>&1
tail -25 "$out/pytest.txt"

step digest 60 "$py" - >"$out/digest_throughput.json" 2>"$out/digest_throughput.log" <<'EOF'
# The SDC digest's cost per step on a GPU: 1 GiB of bf16 parameters in 64 MiB tensors.
import json, time, torch
from ftsup.trainer.digest import Digester
gpu = torch.device("cuda", 0)
params = [(f"p{i}", torch.randn(32 << 20, device=gpu).to(torch.bfloat16)) for i in range(16)]
digest = Digester(params)
digest(); torch.cuda.synchronize()
times = []
for _ in range(20):
    started = time.perf_counter(); digest(); times.append(time.perf_counter() - started)
times.sort()
gib = sum(t.numel() * t.element_size() for _, t in params) / 2**30
print(json.dumps({"bench": "digest_on_gpu", "gib": gib, "median_s": times[10], "min_s": times[0],
                  "gib_per_s": gib / times[10], "device": torch.cuda.get_device_name(0)}))
EOF
cat "$out/digest_throughput.json"

probe=$(mktemp --suffix=.py)  # spawned ranks re-import their main module: a file, not stdin
cat >"$probe" <<'EOF'
# Why every NCCL group in the GPU tests has one rank: two ranks on one device.
import os, torch, torch.distributed as dist, torch.multiprocessing as mp
def rank(r):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=r, world_size=2, device_id=torch.device("cuda", 0))
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"rank {r}: all_reduce on a shared GPU gave {t.tolist()}", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.start_processes(rank, nprocs=2, start_method="spawn")
EOF
step nccl_two_ranks_one_gpu 60 "$py" "$probe" >"$out/nccl_one_gpu_two_ranks.txt" 2>&1
tail -5 "$out/nccl_one_gpu_two_ranks.txt"

step bench_snapshot 240 "$py" -m ftsup.bench.snapshot --device cuda --state-mb "${GPU_CHECK_STATE_MB:-2000}" \
    --peer-state-mb 100 --snapshots 3 --saves 2 >"$out/bench_snapshot_cuda.json" 2>"$out/bench_snapshot_cuda.log"
tail -3 "$out/bench_snapshot_cuda.log"
"$py" -c 'import json, sys; d = json.load(open(sys.argv[1])); print({k: d.get(k) for k in ("device", "state_bytes", "pause_s", "torch_save_s", "held_s", "committed_s", "background_copy_s")}); print(json.dumps(d.get("ftsup_vs_best_peer")))' "$out/bench_snapshot_cuda.json"
cat "$out/steps.txt"
