"""`supervisorctl sdc`'s view: suspects with their digests, checks with verdicts, and the actions."""

from __future__ import annotations

from supervisor import codec
from supervisor.core.events import (
    EndReason,
    GenerationEnded,
    NodeQuarantined,
    Record,
    SdcCheckFinished,
    SdcCheckStarted,
    SdcSuspected,
    SdcVerdict,
)
from supervisor.ctl.sdc_view import sdc_dict, sdc_text


def records(*events):
    return [codec.record_to_proto(Record(i + 1, 1, 0.0, e)) for i, e in enumerate(events)]


def test_the_view_links_suspects_checks_and_verdicts_with_their_evidence():
    log = records(
        SdcSuspected("n3", 2, 5, "bad", "good", 1, 4),
        GenerationEnded(1, EndReason.NODE_QUARANTINED, "n3", 5, "SDC: step 5: rank 2 bad vs majority good"),
        NodeQuarantined("n3", "SDC: step 5: rank 2 bad vs majority good", 1),
        NodeQuarantined("n9", "declared dead: stream closed", 3),  # not SDC: left out
        SdcCheckStarted("c1", 7, 1, "n2", "n4"),
        SdcCheckFinished("c1", SdcVerdict.MATCH, "x", "x"),
        SdcSuspected("n1", 0, 9, "a", "", 2, 2),
        GenerationEnded(2, EndReason.SDC, "", 9, "SDC: step 9: group 0 split [1, 1]"),
    )
    view = sdc_dict(log)
    assert [(s["node_id"], s["step"], s["vote"], s["digest"], s["majority_digest"]) for s in view["suspects"]] == [
        ("n3", 5, "minority", "bad", "good"), ("n1", 9, "split", "a", ""),
    ]
    assert [(v["action"], v["node_id"], v["evidence_seq"]) for v in view["verdicts"]] == [
        ("quarantined", "n3", 1), ("restarted", "", 0),
    ]
    assert view["checks"] == [{"check_id": "c1", "seq": 5, "step": 7, "rank": 1, "suspect_node_id": "n2",
                               "verifier_node_id": "n4", "verdict": "match", "reported_digest": "x",
                               "recomputed_digest": "x"}]
    text = sdc_text(view)
    assert "step 5 n3 rank 2 (minority): digest bad vs majority good" in text
    assert "quarantined n3 (evidence #1)" in text and "replayed on n4: match" in text


def test_an_empty_log_has_nothing_to_show():
    assert sdc_dict([]) == {"checks": [], "suspects": [], "verdicts": []}
