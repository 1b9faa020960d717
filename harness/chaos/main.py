"""`ftsup chaos SCENARIO|all [--json]`: stage failures on a real local cluster and judge the outcome.

Output contract: progress goes to stderr; stdout carries results only. With --json, one
scenario prints one JSON object and `all` (or several names) prints one JSON object per line
(JSON Lines, in registry order). Without --json, a table. Exit codes: 0 every scenario that ran
passed (skipped ones, whose capability is missing, do not fail the run), 1 one or more failed,
2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import tempfile
from typing import TYPE_CHECKING

from ftsup.harness.chaos.runner import Result, RunContext, S3Endpoint, run_scenario
from ftsup.harness.chaos.scenarios import BY_NAME, SCENARIOS

if TYPE_CHECKING:  # the soak itself is imported when it runs
    from ftsup.harness.chaos.soak import Failure

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {s.name:<24} {s.description}" for s in SCENARIOS)
    p = argparse.ArgumentParser(
        prog="ftsup chaos", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Stage failures on a real local cluster and check ftsup's recovery.",
        epilog=f"scenarios:\n{listing}\n\n`all` runs every scenario in this order. `soak` (alone) runs one long"
               " job through --failures mixed failures and checks every resource returns to its baseline.",
    )  # fmt: skip
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="scenario names, or `all`")
    p.add_argument("--json", action="store_true", help="JSON on stdout: one object per scenario, one per line")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--workdir", type=pathlib.Path, default=None, help="where cluster logs go (default: a new temp dir)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="give up on one scenario after this long")
    p.add_argument("--s3-endpoint", default="", metavar="URL",
                   help="S3 server (http://HOST:PORT) for scenarios that checkpoint to S3; default: start a"
                        " SeaweedFS (credentials from the environment when given)")
    p.add_argument("--s3-bucket", default="", help="bucket on --s3-endpoint (required with it)")
    p.add_argument("--s3-region", default="us-east-1", help="region of --s3-endpoint")
    p.add_argument("--failures", type=int, default=50,
                   help="`soak` only: failures to put one job through (default 50)")
    p.add_argument("--etcd", action="store_true",
                   help="`soak` only: three supervisor replicas on a local 3-member etcd cluster, with leader"
                        " kills in the rotation")
    return p


def run_soak(args: argparse.Namespace, ctx: RunContext) -> int:
    """`ftsup chaos soak`: one JSON line per failure, then the summary line (baselines, problems)."""
    from ftsup.harness.chaos.soak import Soak

    def report(failure: Failure) -> None:
        if args.json:
            print(json.dumps({"failure": failure.as_dict()}), flush=True)

    result = Soak(ctx, args.failures, use_etcd=args.etcd).run(report)
    if args.json:
        print(json.dumps(result.summary()), flush=True)
    else:
        summary = result.summary()
        print(f"soak {'passed' if result.passed else 'FAILED'}: {summary['failures']} failures,"
              f" {summary['lost_steps_total']} steps lost in all, bitwise match {summary['bitwise_match']},"
              f" {summary['duration_s']} s")
        for f in result.failures:
            print(f"  {f.index:>3} {f.kind:<22} {f.node:<8} step {f.step:>4} recovered_s {f.recovered_s}"
                  f" lost {f.lost_steps}")
        for problem in result.problems:
            print(f"  - {problem}")
    return EXIT_OK if result.passed else EXIT_FAILED


def chosen(names: list[str]) -> list[str] | str:
    """The scenario names to run in registry order, or an error message naming the bad value."""
    if not names:
        return "name a scenario or `all` (--list shows them)"
    if "all" in names:
        return [s.name for s in SCENARIOS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        return f"unknown scenario {unknown[0]!r}; known: {', '.join(BY_NAME)}"
    return [s.name for s in SCENARIOS if s.name in names]


def render_table(results: list[Result]) -> str:
    head = f"{'scenario':<24} {'result':<8} {'detected_s':>10} {'recovered_s':>11} {'lost':>5} {'bitwise':>8} {'ev_lost':>7} {'ck_lost':>7}"
    lines = [head]
    for r in results:
        verdict = "skipped" if r.passed is None else ("passed" if r.passed else "FAILED")
        d = r.as_dict()
        cells = [("-" if d[k] is None else str(d[k])) for k in
                 ("detected_s", "recovered_s", "lost_steps", "bitwise_match", "events_lost", "checkpoints_lost")]
        lines.append(f"{r.scenario:<24} {verdict:<8} {cells[0]:>10} {cells[1]:>11} {cells[2]:>5} {cells[3]:>8} "
                     f"{cells[4]:>7} {cells[5]:>7}")
        for problem in r.problems:
            lines.append(f"    - {problem}")
        if r.skipped:
            lines.append(f"    - {r.skipped}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.list:
        for s in SCENARIOS:
            print(f"{s.name:<24} {s.description}" + (f" [needs: {', '.join(s.needs)}]" if s.needs else ""))
        return EXIT_OK
    is_soak = args.scenarios == ["soak"]
    if is_soak and args.failures < 1:
        print(f"ftsup chaos: --failures must be >= 1, got {args.failures}", file=sys.stderr)
        return EXIT_USAGE
    if args.etcd and not is_soak:
        print("ftsup chaos: --etcd applies to `soak` (scenarios choose their own supervisors)", file=sys.stderr)
        return EXIT_USAGE
    names = ["soak"] if is_soak else chosen(args.scenarios)
    if isinstance(names, str):
        print(f"ftsup chaos: {names}", file=sys.stderr)
        return EXIT_USAGE
    if not args.timeout_s > 0:
        print(f"ftsup chaos: --timeout-s must be > 0, got {args.timeout_s}", file=sys.stderr)
        return EXIT_USAGE
    if bool(args.s3_endpoint) != bool(args.s3_bucket):
        print("ftsup chaos: --s3-endpoint and --s3-bucket go together", file=sys.stderr)
        return EXIT_USAGE
    if args.s3_endpoint and not re.fullmatch(r"http://[^/:]+:\d+/?", args.s3_endpoint):
        print(f"ftsup chaos: --s3-endpoint must be http://HOST:PORT (the fault proxy speaks HTTP), got"
              f" {args.s3_endpoint!r}", file=sys.stderr)
        return EXIT_USAGE
    workdir = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="ftsup-chaos-"))

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    s3 = S3Endpoint(args.s3_endpoint.rstrip("/"), args.s3_bucket, args.s3_region) if args.s3_endpoint else None
    ctx = RunContext(workdir, say, timeout_s=args.timeout_s, s3_endpoint=s3)
    results: list[Result] = []
    try:
        if is_soak:
            return run_soak(args, ctx)
        for name in names:
            result = run_scenario(BY_NAME[name], ctx)
            results.append(result)
            verdict = "skipped" if result.passed is None else ("passed" if result.passed else "FAILED")
            say(f"[{name}] {verdict}: {json.dumps(result.as_dict())}")
            if args.json:
                print(json.dumps(result.as_dict()), flush=True)
    except KeyboardInterrupt:
        say(f"ftsup chaos: interrupted; clusters stopped, logs in {workdir}")
        return EXIT_INTERRUPTED
    finally:
        ctx.close()
    if not args.json:
        print(render_table(results))
    return EXIT_FAILED if any(r.passed is False for r in results) else EXIT_OK
