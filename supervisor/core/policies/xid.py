"""Xid policy: the reviewed table code -> (severity, meaning, action) and the repeat rules.

Pure: `judge_xid(history, record, now, config)` reads only its arguments. Sources: NVIDIA's Xid
catalogue for Ampere and newer (its "resolution bucket" per code) and the practitioner notes in
shared/ANCHORS.md section 4.2; meanings are written for an operator of a training job.

Actions, mildest first: IGNORE (nothing to do), RESTART_JOB (the job's processes died or must
die; the GPU is fine), RESET_GPU (the GPU must be reset before it runs work again: its ranks go
elsewhere until then), QUARANTINE_NODE (a person or a reboot must look at the node first).

Why each family maps as it does:
- Application-attributable engine faults (13, 31, 32, 68, 69, 8): NVIDIA says restart the app.
  The same fault repeating on the same GPU points at the hardware (the catalogue's Xid 31 rule:
  same GPU -> run diagnostics), so a repeat quarantines the node for diagnostics.
- Sympathetic and informational lines (43, 45, 63, 137): they follow another Xid which carries
  the real verdict; acting on them too would double-count. Xid 63 (a row remap was recorded)
  repeating within a day means the memory is wearing out, so it escalates.
- Memory errors: a contained error (94) killed only the process touching the page -> restart;
  an uncontained one (95), a double-bit error (48) or an escaped ECC error (140) leave the GPU
  suspect until a reset remaps the rows -> reset; a repeat, or a failed remap (64: no spare rows,
  treated as RMA as AWS and NVIDIA's memory RMA policy do) -> quarantine. A high single-bit rate
  (92) is corrected and ignored unless it recurs.
- Firmware and micro-controllers (38, 61, 62, 119, 120): hung firmware needs a GPU reset (the
  catalogue lists 38 as ignorable; we only escalate it on repeats); repeated GSP or PMU failures
  quarantine.
- Interconnect (74, 144-150): an NVLink error breaks the job's collectives; we do not decode the
  link registers, so we reset the GPU (NVLink5 lines marked Nonfatal are ignored) and quarantine
  on repeats: a flapping link needs a person.
- 79 (fallen off the bus): only a reboot brings the GPU back -> quarantine the node.
- 154 states the driver's own recovery verdict; we follow it (0x0 none, 0x1 reset, 0x2 reboot,
  0x4 drain and reset).
Unknown codes get `config.unknown_action` (restart, by default) and are flagged unknown.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ftsup.supervisor.core.events import XidAction  # one enum: the policy's verdict is what the log records

# Escalation never lowers an action: this is the order of "more drastic".
_RANK = {XidAction.IGNORE: 0, XidAction.RESTART_JOB: 1, XidAction.RESET_GPU: 2, XidAction.QUARANTINE_NODE: 3}


def _stronger(a: XidAction, b: XidAction) -> XidAction:
    return a if _RANK[a] >= _RANK[b] else b


class Severity(enum.Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    FATAL = "fatal"


@dataclass(frozen=True, slots=True)
class Repeat:
    """`count` sightings of the code on the same GPU within `window_s` (this one included) escalate."""

    count: int
    window_s: float
    escalate_to: XidAction


@dataclass(frozen=True, slots=True)
class XidRule:
    code: int
    severity: Severity
    meaning: str
    action: XidAction
    repeat: Repeat | None = None


HOUR_S = 3600.0
DAY_S = 24 * HOUR_S
_APP_REPEAT = Repeat(3, HOUR_S, XidAction.QUARANTINE_NODE)
_HW_REPEAT = Repeat(2, DAY_S, XidAction.QUARANTINE_NODE)
_LINK_REPEAT = Repeat(3, HOUR_S, XidAction.QUARANTINE_NODE)

_I, _W, _E, _F = Severity.INFO, Severity.WARNING, Severity.ERROR, Severity.FATAL
_IGN, _RST, _RES, _QUA = XidAction.IGNORE, XidAction.RESTART_JOB, XidAction.RESET_GPU, XidAction.QUARANTINE_NODE


def _rules(*rules: XidRule) -> dict[int, XidRule]:
    table = {rule.code: rule for rule in rules}
    assert len(table) == len(rules), "duplicate Xid code in the policy table"
    return table


XID_TABLE: dict[int, XidRule] = _rules(
    XidRule(8, _W, "GPU stopped processing (channel idle timeout)", _RST, _APP_REPEAT),
    XidRule(13, _W, "graphics engine exception: usually a kernel bug such as an out-of-bounds access", _RST,
            _APP_REPEAT),
    XidRule(31, _W, "GPU memory page fault: a kernel touched an unmapped address (app bug, or bad memory "
            "when it repeats on one GPU)", _RST, _APP_REPEAT),
    XidRule(32, _W, "corrupted push buffer stream: bad commands reached the GPU (driver, PCIe or app)", _RST,
            _APP_REPEAT),
    XidRule(38, _W, "driver firmware error (engine watchdog timeout)", _IGN, Repeat(3, HOUR_S, _RES)),
    XidRule(43, _I, "GPU stopped processing the channel of a faulting process; follows the real fault", _IGN),
    XidRule(45, _I, "preemptive cleanup of channels after another error; follows the real fault", _IGN),
    XidRule(46, _E, "GPU stopped processing (GPU timeout)", _RES, _HW_REPEAT),
    XidRule(48, _F, "double-bit ECC error: uncorrectable memory error", _RES, _HW_REPEAT),
    XidRule(61, _E, "internal micro-controller breakpoint or warning; often precedes a halt", _RES, _HW_REPEAT),
    XidRule(62, _E, "internal micro-controller (PMU) halted", _RES, _HW_REPEAT),
    XidRule(63, _I, "a memory row remap or page retirement was recorded; applies at the next reset", _IGN,
            Repeat(4, DAY_S, _QUA)),
    XidRule(64, _F, "memory row remap failed: no spare rows left (RMA candidate)", _QUA),
    XidRule(68, _W, "video decoder (NVDEC) exception", _RST, Repeat(3, HOUR_S, _RES)),
    XidRule(69, _W, "graphics engine class error: an invalid method or class reached the engine", _RST,
            _APP_REPEAT),
    XidRule(74, _E, "NVLink error: a link to a peer GPU or switch failed", _RES, _LINK_REPEAT),
    XidRule(79, _F, "GPU has fallen off the bus: unreachable until the node reboots", _QUA),
    XidRule(92, _W, "high single-bit (corrected) ECC error rate", _IGN, Repeat(3, DAY_S, _QUA)),
    XidRule(94, _E, "contained memory error: only the process using the page was affected", _RST,
            Repeat(2, DAY_S, _RES)),
    XidRule(95, _F, "uncontained memory error: other processes on the GPU may be affected", _RES, _HW_REPEAT),
    XidRule(109, _E, "context switch timeout", _RES, _HW_REPEAT),
    XidRule(119, _E, "GPU System Processor (GSP) RPC timeout", _RES, _HW_REPEAT),
    XidRule(120, _E, "GPU System Processor (GSP) error", _RES, _HW_REPEAT),
    XidRule(136, _E, "NVLink training failed", _RES, _LINK_REPEAT),
    XidRule(137, _I, "NVLink privilege error; usually a symptom, followed by the real fault", _IGN),
    XidRule(140, _F, "unrecovered ECC error escaped containment", _RES, _HW_REPEAT),
    XidRule(143, _E, "GPU initialization error", _RES, _HW_REPEAT),
    XidRule(144, _E, "NVLink5 SAW error", _RES, _LINK_REPEAT),
    XidRule(145, _E, "NVLink5 RLW error", _RES, _LINK_REPEAT),
    XidRule(146, _E, "NVLink5 TLW error", _RES, _LINK_REPEAT),
    XidRule(147, _E, "NVLink5 TREX error", _RES, _LINK_REPEAT),
    XidRule(148, _E, "NVLink5 NVLPW control error", _RES, _LINK_REPEAT),
    XidRule(149, _E, "NVLink5 NETIR (network interface) error", _RES, _LINK_REPEAT),
    XidRule(150, _E, "NVLink5 MSE error", _RES, _LINK_REPEAT),
    XidRule(154, _I, "the driver changed the GPU's recovery action; we follow the stated action", _IGN),
    XidRule(155, _E, "NVLink software-defined error", _RES, _LINK_REPEAT),
    XidRule(156, _W, "resource retirement event: takes effect after a GPU reset", _RES, _HW_REPEAT),
    XidRule(158, _F, "GPU fatal timeout", _RES, _HW_REPEAT),
)

_NVLINK5 = range(144, 151)
# "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)": the value after "to".
_RECOVERY_TO = re.compile(r"\bto (0x[0-9a-fA-F]+)")
_RECOVERY_ACTIONS = {0x0: _IGN, 0x1: _RES, 0x2: _QUA, 0x3: _RES, 0x4: _RES}
_RECOVERY_NAMES = {0x0: "none", 0x1: "GPU reset", 0x2: "node reboot", 0x3: "drain peer traffic", 0x4: "drain and reset"}
_NONFATAL = re.compile(r"\bnon-?fatal\b", re.IGNORECASE)


class XidLike(Protocol):
    """What the policy reads from an Xid report (the agent's XidRecord and the supervisor's input both fit)."""

    @property
    def pci(self) -> str: ...
    @property
    def code(self) -> int: ...
    @property
    def message(self) -> str: ...


@dataclass(frozen=True, slots=True)
class XidSighting:
    """An earlier Xid on the same node, as the caller keeps them (time in the `now` clock)."""

    time_s: float
    code: int
    pci: str


@dataclass(frozen=True, slots=True)
class XidPolicyConfig:
    unknown_action: XidAction = XidAction.RESTART_JOB
    is_repeat_escalation_enabled: bool = True
    # Operator overrides of a code's base action, e.g. ((63, XidAction.RESET_GPU),).
    action_overrides: tuple[tuple[int, XidAction], ...] = ()


@dataclass(frozen=True, slots=True)
class XidVerdict:
    action: XidAction
    reason: str
    is_unknown: bool
    code: int
    severity: Severity
    meaning: str
    repeats: int  # sightings of this code on this GPU within the rule's window, this one included


def meaning_of(code: int) -> str:
    rule = XID_TABLE.get(code)
    return rule.meaning if rule else f"unknown Xid {code} (not in the policy table)"


def judge_xid(history: Iterable[XidSighting], record: XidLike, now: float, config: XidPolicyConfig) -> XidVerdict:
    """Decides what to do about one Xid, given the earlier sightings on the same node.

    `history` must not contain `record` itself; only sightings of the same code on the same
    GPU (PCI id) within the rule's window count towards its repeat threshold.
    """
    rule = XID_TABLE.get(record.code)
    if rule is None:
        action = config.unknown_action
        reason = f"Xid {record.code} is not in the policy table: {action.value} (conservative default)"
        return XidVerdict(action, reason, True, record.code, Severity.ERROR, meaning_of(record.code), 1)
    action, reason = _base_action(rule, record, config)
    repeats = 1
    if rule.repeat is not None:
        since = now - rule.repeat.window_s
        repeats += sum(1 for s in history if s.code == record.code and s.pci == record.pci and since <= s.time_s <= now)
        if config.is_repeat_escalation_enabled and repeats >= rule.repeat.count:
            escalated = _stronger(action, rule.repeat.escalate_to)
            if escalated is not action:
                reason = (
                    f"{reason}; seen {repeats} times on {record.pci} within {rule.repeat.window_s:g}s "
                    f"(limit {rule.repeat.count}): {escalated.value}"
                )
                action = escalated
    return XidVerdict(action, reason, False, record.code, rule.severity, rule.meaning, repeats)


def _base_action(rule: XidRule, record: XidLike, config: XidPolicyConfig) -> tuple[XidAction, str]:
    overrides = dict(config.action_overrides)
    if rule.code in overrides:
        action = overrides[rule.code]
        return action, f"Xid {rule.code} ({rule.meaning}): {action.value} (operator override)"
    if rule.code == 154:
        match = _RECOVERY_TO.search(record.message)
        value = int(match.group(1), 16) if match else None
        if value is None or value not in _RECOVERY_ACTIONS:
            action = config.unknown_action
            return action, f"Xid 154 with an unreadable recovery action {record.message!r}: {action.value}"
        action = _RECOVERY_ACTIONS[value]
        return action, f"Xid 154: driver requires {_RECOVERY_NAMES[value]}: {action.value}"
    if rule.code in _NVLINK5 and _NONFATAL.search(record.message):
        return XidAction.IGNORE, f"Xid {rule.code} ({rule.meaning}) reported non-fatal: ignore"
    return rule.action, f"Xid {rule.code} ({rule.meaning}): {rule.action.value}"
