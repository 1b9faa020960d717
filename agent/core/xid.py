"""Kernel-log line -> XidRecord: the NVIDIA driver's `NVRM: Xid (PCI:...): CODE, ...` lines.

Pure (stdlib `re` and `dataclasses` only): the agent's kernel-log reader and `ftsup xid` feed
lines in; nothing here reads files or clocks. A line is accepted only when the text before
`NVRM: Xid` is a reader's prefix (dmesg / syslog / journalctl / /dev/kmsg headers): a user-space
process that quotes an Xid in its own log is not the driver reporting one. NVSwitch `SXid` lines
and the `NVRM: GPU at PCI:...` preamble are not Xids and are rejected (see `parse_gpu_at_line`
for the preamble, which maps a PCI id to a GPU UUID).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# Xid codes are small positive integers (the catalogue ends in the 170s); anything longer is a
# garbled line, not a new code.
MAX_XID_CODE = 999


@dataclass(frozen=True, slots=True)
class XidRecord:
    pci: str  # kernel form, lower case, no function digit: "0000:3b:00"
    gpu: int | None  # GPU index when the caller's PCI map knows it
    code: int
    pid: int | None
    process: str | None
    message: str


# What may precede "NVRM:". Each alternative is one reader's header; they may stack, e.g.
# syslog's "Dec  2 10:43:35 host kernel: [240314.528856] ".
_PREFIX_PARTS = (
    r"<\d{1,3}>",  # syslog priority "<4>"
    r"\d+,\d+,\d+,[^;]*;",  # /dev/kmsg record header "4,1234,5678,-;"
    # syslog / journalctl short: "Dec  2 10:43:35 host kernel:"
    r"[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)? +\S+ +kernel:",
    # journalctl -o short-iso / rsyslog RFC 3339: "2025-01-21T04:41:44+0000 host kernel:"
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? +\S+ +kernel:",
    r"kernel:",  # journald without a header
    r"kern *: *[a-z]+ *:",  # dmesg --decode "kern  :warn  :"
    # dmesg --time-format=iso "2025-01-21T04:41:44,283302+00:00"
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?",
    r"\[[^\]]{1,40}\]",  # dmesg "[ 1843.308145]" or dmesg -T "[Sun Feb 23 16:24:18 2025]"
)
_PREFIX = re.compile(r"(?:(?:" + "|".join(_PREFIX_PARTS) + r")\s*)*")

_PCI = r"(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
# The code must end the line or be followed by a comma: "79," yes, "79abc" or "abc" no.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?" + _PCI + r"\): (?P<code>\d{1,3})(?:,\s*(?P<rest>.*?))?\s*$")
_PID = re.compile(r"pid=(?P<pid>'<unknown>'|<unknown>|'?\d+'?)(?:,\s*|\s+|$)")
_NAME = re.compile(r"name=(?P<name>[^,]*?)(?:,\s*|$)")
_GPU_AT = re.compile(r"NVRM: GPU at PCI:" + _PCI + r": (?P<uuid>GPU-[0-9a-fA-F-]+)\s*$")


def normalize_pci(pci: str) -> str:
    """Returns the kernel-log form of a PCI bus id: "00000000:3B:00.0" -> "0000:3b:00".

    nvidia-smi prints an 8-digit domain and a function; the driver's Xid line prints a 4-digit
    domain and no function. Both name the same device.
    """
    text = pci.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    text = text.split(".", 1)[0]
    parts = text.split(":")
    if len(parts) == 3 and len(parts[0]) > 4 and set(parts[0][:-4]) <= {"0"}:
        parts[0] = parts[0][-4:]
    return ":".join(parts)


def _strip_prefix(line: str) -> str | None:
    """Returns the text from "NVRM:" on, or None when something other than a reader's header precedes it."""
    match = _PREFIX.match(line)
    rest = line[match.end():] if match else line
    return rest if rest.startswith("NVRM:") else None


def parse_xid_line(line: str, gpu_by_pci: Mapping[str, int] | None = None) -> XidRecord | None:
    """Parses one kernel-log line into an XidRecord, or None when it is not an Xid line.

    Args:
        line: one line of dmesg, journalctl -k, syslog or /dev/kmsg output.
        gpu_by_pci: optional PCI id -> GPU index (e.g. from nvidia-smi), in either PCI form.
    """
    body = _strip_prefix(line.strip())
    if body is None:
        return None
    match = _XID.match(body)
    if match is None:
        return None
    code = int(match["code"])
    if not 1 <= code <= MAX_XID_CODE:
        return None
    pci = normalize_pci(match["pci"])
    pid, process, message = _split_rest(match["rest"] or "")
    gpu = None
    if gpu_by_pci:
        gpu = {normalize_pci(k): v for k, v in gpu_by_pci.items()}.get(pci)
    return XidRecord(pci=pci, gpu=gpu, code=code, pid=pid, process=process, message=message)


def _split_rest(rest: str) -> tuple[int | None, str | None, str]:
    """Splits "pid=1234, name=python, message" into its parts; each of pid and name is optional."""
    pid: int | None = None
    process: str | None = None
    pid_match = _PID.match(rest)
    if pid_match:
        raw = pid_match["pid"].strip("'")
        pid = int(raw) if raw.isdigit() else None
        rest = rest[pid_match.end():]
    name_match = _NAME.match(rest)
    if name_match:
        raw_name = name_match["name"].strip().strip("'")
        process = None if raw_name in ("", "<unknown>") else raw_name
        rest = rest[name_match.end():]
    return pid, process, rest.strip()


def parse_gpu_at_line(line: str) -> tuple[str, str] | None:
    """Parses the driver's `NVRM: GPU at PCI:0000:01:00: GPU-<uuid>` preamble into (pci, uuid)."""
    body = _strip_prefix(line.strip())
    if body is None:
        return None
    match = _GPU_AT.match(body)
    if match is None:
        return None
    return normalize_pci(match["pci"]), match["uuid"]
