"""The Xid policy table and its repeat rules."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ftsup.supervisor.core.policies.xid import (
    XID_TABLE,
    XidAction,
    XidPolicyConfig,
    XidSighting,
    judge_xid,
)

NOW = 1_000_000.0
CONFIG = XidPolicyConfig()
PCI = "0000:3b:00"
REQUIRED_CODES = [13, 31, 32, 38, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 149, 154]


@dataclass(frozen=True)
class Xid:
    code: int
    message: str = ""
    pci: str = PCI


def sightings(code: int, ages_s: list[float], pci: str = PCI) -> list[XidSighting]:
    return [XidSighting(NOW - age, code, pci) for age in ages_s]


@pytest.mark.parametrize("code", REQUIRED_CODES)
def test_every_required_code_has_a_rule_with_meaning_and_action(code):
    rule = XID_TABLE[code]
    assert rule.meaning and isinstance(rule.action, XidAction)
    verdict = judge_xid((), Xid(code), NOW, CONFIG)
    assert not verdict.is_unknown and verdict.reason


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (13, XidAction.RESTART_JOB), (31, XidAction.RESTART_JOB), (43, XidAction.IGNORE), (45, XidAction.IGNORE),
        (48, XidAction.RESET_GPU), (63, XidAction.IGNORE), (64, XidAction.QUARANTINE_NODE),
        (79, XidAction.QUARANTINE_NODE), (92, XidAction.IGNORE), (94, XidAction.RESTART_JOB),
        (95, XidAction.RESET_GPU), (119, XidAction.RESET_GPU),
    ],
)
def test_single_sighting_takes_the_tables_action(code, action):
    assert judge_xid((), Xid(code), NOW, CONFIG).action is action


def test_repeats_of_an_app_fault_on_one_gpu_within_the_window_quarantine_the_node():
    verdict = judge_xid(sightings(31, [60.0, 600.0]), Xid(31), NOW, CONFIG)
    assert verdict.action is XidAction.QUARANTINE_NODE
    assert verdict.repeats == 3 and "seen 3 times" in verdict.reason


def test_repeats_outside_the_window_or_on_another_gpu_or_code_do_not_count():
    history = sightings(31, [4_000.0, 7_200.0]) + sightings(31, [10.0], pci="0000:5e:00") + sightings(13, [5.0])
    verdict = judge_xid(history, Xid(31), NOW, CONFIG)
    assert verdict.action is XidAction.RESTART_JOB and verdict.repeats == 1


def test_recurring_correctable_errors_escalate():
    assert judge_xid(sightings(92, [3_600.0, 7_200.0]), Xid(92), NOW, CONFIG).action is XidAction.QUARANTINE_NODE
    assert judge_xid(sightings(63, [1.0, 2.0]), Xid(63), NOW, CONFIG).action is XidAction.IGNORE
    assert judge_xid(sightings(63, [1.0, 2.0, 3.0]), Xid(63), NOW, CONFIG).action is XidAction.QUARANTINE_NODE
    assert judge_xid(sightings(94, [100.0]), Xid(94), NOW, CONFIG).action is XidAction.RESET_GPU


def test_repeat_escalation_can_be_turned_off():
    config = XidPolicyConfig(is_repeat_escalation_enabled=False)
    assert judge_xid(sightings(31, [1.0, 2.0]), Xid(31), NOW, config).action is XidAction.RESTART_JOB


def test_escalation_never_weakens_an_action():
    assert judge_xid(sightings(79, [1.0] * 5), Xid(79), NOW, CONFIG).action is XidAction.QUARANTINE_NODE


def test_unknown_code_gets_the_conservative_default_and_is_flagged():
    verdict = judge_xid((), Xid(14), NOW, CONFIG)
    assert verdict.is_unknown and verdict.action is XidAction.RESTART_JOB
    assert "not in the policy table" in verdict.reason
    strict = XidPolicyConfig(unknown_action=XidAction.QUARANTINE_NODE)
    assert judge_xid((), Xid(999), NOW, strict).action is XidAction.QUARANTINE_NODE


@pytest.mark.parametrize(
    ("message", "action"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x0 (None)", XidAction.IGNORE),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", XidAction.RESET_GPU),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", XidAction.QUARANTINE_NODE),
        ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", XidAction.RESET_GPU),
        ("GPU recovery action changed", XidAction.RESTART_JOB),
    ],
)
def test_xid_154_follows_the_drivers_stated_recovery_action(message, action):
    assert judge_xid((), Xid(154, message), NOW, CONFIG).action is action


def test_nonfatal_nvlink5_error_is_ignored_and_fatal_resets():
    assert judge_xid((), Xid(149, "NETIR_INT  Nonfatal XC0 i0 Link 3"), NOW, CONFIG).action is XidAction.IGNORE
    assert judge_xid((), Xid(149, "NETIR_INT  Fatal   XC0 i0 Link -1"), NOW, CONFIG).action is XidAction.RESET_GPU


def test_operator_override_replaces_the_base_action():
    config = XidPolicyConfig(action_overrides=((63, XidAction.RESET_GPU),))
    verdict = judge_xid((), Xid(63), NOW, config)
    assert verdict.action is XidAction.RESET_GPU and "operator override" in verdict.reason
