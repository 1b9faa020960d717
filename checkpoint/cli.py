"""`ftsup checkpoints list|gc LOCATION`: what a checkpoint store holds, and retention run by hand.

For operators, straight against the store (no supervisor needed: a job that is gone still leaves
checkpoints and unfinished uploads behind). `gc` aborts unfinished uploads older than
`--multipart-older-than` (S3 multipart uploads of crashed writers, billed until aborted; local
temp files) and, with `--keep K`, applies retention like the supervisor does after each commit.
Without `--keep` no checkpoint is deleted. Credentials come only from boto3's chain (environment,
profile, instance role) and are never printed. Output contract: results on stdout (a table, or
one JSON object with --json), errors on stderr; exit 0 done, 1 the store failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time
from typing import Any

from ftsup.checkpoint.policy import DEFAULT_UPLOAD_MAX_AGE_S, GcPlan, UploadVerdict
from ftsup.checkpoint.store import PendingUpload

EXIT_OK, EXIT_STORE, EXIT_USAGE = 0, 1, 2
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration_s(text: str) -> float:
    """'90', '90s', '30m', '1h', '2d' -> seconds; ValueError naming the value otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"duration {text!r}: expected a number with an optional unit s, m, h or d (e.g. 1h)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup checkpoints", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("location", help="s3://bucket/prefix or a directory (as --checkpoint-location)")
    common.add_argument("--endpoint", default="", help="S3 endpoint URL (MinIO, SeaweedFS...); default AWS")
    common.add_argument("--region", default="", help="S3 region")
    common.add_argument("--json", action="store_true", help="one JSON object on stdout")
    sub.add_parser("list", parents=[common], help="committed checkpoints, incomplete attempts, unfinished uploads")
    gc = sub.add_parser("gc", parents=[common], help="abort stale unfinished uploads; with --keep, retention too")
    gc.add_argument("--keep", type=int, default=None,
                    help="keep the newest K committed checkpoints and delete older ones and abandoned attempts"
                         " (default: delete no checkpoint)")
    gc.add_argument("--multipart-older-than", default=f"{DEFAULT_UPLOAD_MAX_AGE_S:g}s", metavar="DURATION",
                    help="abort unfinished uploads started at least this long ago (default 1h; e.g. 30m, 2d)")
    gc.add_argument("--in-flight", action="append", default=[], metavar="CHECKPOINT_ID",
                    help="a checkpoint being written now: its attempt and uploads are left alone (repeatable)")
    gc.add_argument("--dry-run", action="store_true", help="say what would be deleted and aborted; change nothing")
    return p


def uploads_dicts(verdicts: tuple[UploadVerdict, ...], now_unix_s: float) -> list[dict[str, Any]]:
    return [{"key": v.upload.key, "upload_id": v.upload.upload_id,
             "age_s": round(now_unix_s - v.upload.initiated_unix_s, 1), "stale": v.is_stale, "reason": v.reason}
            for v in verdicts]


def gc_dict(location: str, plan: GcPlan | None, verdicts: tuple[UploadVerdict, ...], older_than_s: float,
            now_unix_s: float, dry_run: bool) -> dict[str, Any]:
    """The JSON answer of `gc` (pure). Counts are of what was done, or would be with dry_run."""
    stale = [v for v in verdicts if v.is_stale]
    return {
        "location": location, "dry_run": dry_run, "multipart_older_than_s": older_than_s,
        "uploads_aborted": len(stale), "uploads_kept": len(verdicts) - len(stale),
        "checkpoints_deleted": list(plan.delete_committed) if plan else [],
        "attempts_deleted": list(plan.delete_incomplete) if plan else [],
        "checkpoints_kept": list(plan.kept) if plan else None,
        "uploads": uploads_dicts(verdicts, now_unix_s),
    }


def gc_text(d: dict[str, Any]) -> str:
    verb = "would abort" if d["dry_run"] else "aborted"
    lines = [f"{d['location']}: {verb} {d['uploads_aborted']} unfinished uploads older than"
             f" {d['multipart_older_than_s']:g}s, kept {d['uploads_kept']}"]
    for u in d["uploads"]:
        lines.append(f"  {'abort' if u['stale'] else 'keep '} {u['key']} ({u['reason']})")
    if d["checkpoints_kept"] is None:
        lines.append("retention: not run (no --keep)")
    else:
        deleted = "would delete" if d["dry_run"] else "deleted"
        lines.append(f"retention: kept {', '.join(d['checkpoints_kept']) or 'none'}; {deleted} checkpoints"
                     f" {', '.join(d['checkpoints_deleted']) or 'none'}, attempts {', '.join(d['attempts_deleted']) or 'none'}")
    return "\n".join(lines)


def list_dict(location: str, catalog: Any, uploads: tuple[PendingUpload, ...], now_unix_s: float) -> dict[str, Any]:
    return {
        "location": location,
        "committed": [{"checkpoint_id": m.checkpoint_id, "step": m.step, "objects": len(m.objects),
                       "bytes": sum(o.size_bytes for o in m.objects), "world_size": m.topology.world_size,
                       "committed_at": m.committed_at} for m in catalog.committed],
        "incomplete": list(catalog.incomplete),
        "uploads": [{"key": u.key, "upload_id": u.upload_id, "age_s": round(now_unix_s - u.initiated_unix_s, 1)}
                    for u in uploads],
    }


def list_text(d: dict[str, Any]) -> str:
    lines = [f"{d['location']}: {len(d['committed'])} committed, {len(d['incomplete'])} incomplete,"
             f" {len(d['uploads'])} unfinished uploads"]
    for m in d["committed"]:
        lines.append(f"  {m['checkpoint_id']}  step {m['step']}  {m['objects']} objects  {m['bytes']} bytes"
                     f"  world {m['world_size']}  {m['committed_at']}")
    lines += [f"  {cid}  (no manifest)" for cid in d["incomplete"]]
    lines += [f"  upload {u['key']}  {u['age_s']:g}s old" for u in d["uploads"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from ftsup.checkpoint import catalog
    from ftsup.checkpoint.errors import CheckpointError
    from ftsup.checkpoint.location import open_location, parse_location

    try:
        location = parse_location(args.location)
        if location.scheme == "file" and not pathlib.Path(location.bucket_or_dir).is_dir():
            raise ValueError(f"{args.location!r} is not a directory")
        older_than_s = parse_duration_s(args.multipart_older_than) if args.command == "gc" else 0.0
        if args.command == "gc" and args.keep is not None and args.keep < 1:
            raise ValueError(f"--keep must be >= 1 (never delete the newest checkpoint), got {args.keep}")
        store, layout = open_location(args.location, endpoint_url=args.endpoint or None, region=args.region or None)
    except ValueError as exc:
        print(f"ftsup checkpoints: {exc}", file=sys.stderr)
        return EXIT_USAGE
    now = time.time()
    try:
        if args.command == "list":
            result = list_dict(args.location, catalog.scan(store, layout), store.list_uploads(layout.root()), now)
            text = list_text(result)
        else:
            in_flight = frozenset(args.in_flight)
            if args.keep is None:
                plan = None
                verdicts = catalog.abort_stale_uploads(store, layout, older_than_s, in_flight, now_unix_s=now,
                                                       dry_run=args.dry_run)
            else:
                plan = catalog.gc(store, layout, args.keep, in_flight, uploads_older_than_s=older_than_s,
                                  now_unix_s=now, dry_run=args.dry_run)
                verdicts = plan.uploads
            result = gc_dict(args.location, plan, verdicts, older_than_s, now, args.dry_run)
            text = gc_text(result)
    except CheckpointError as exc:
        print(f"ftsup checkpoints {args.command}: {exc}", file=sys.stderr)
        return EXIT_STORE
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    print(json.dumps(result) if args.json else text)
    return EXIT_OK
