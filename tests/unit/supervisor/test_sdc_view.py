"""`supervisorctl sdc`'s view: suspects with their digests, checks with verdicts, and the actions."""

from __future__ import annotations

from ftsup.supervisor import codec
from ftsup.supervisor.core.events import (
    EndReason,
    GenerationEnded,
    NodeQuarantined,
    QuarantineCause,
    Record,
    SdcCheckFinished,
    SdcCheckStarted,
    SdcRankDigests,
    SdcSuspected,
    SdcVerdict,
)
from ftsup.supervisor.ctl.sdc_view import sdc_dict, sdc_text


def records(*events):
    return [codec.record_to_proto(Record(i + 1, 1, 0.0, e)) for i, e in enumerate(events)]


def test_the_view_links_suspects_checks_and_verdicts_with_their_evidence():
    log = records(
        SdcSuspected("n3", 2, 5, "bad", "good", 1, 4),
        GenerationEnded(1, EndReason.NODE_QUARANTINED, "n3", 5, "SDC: step 5: rank 2 bad vs majority good"),
        NodeQuarantined("n3", "SDC: step 5: rank 2 bad vs majority good", 1),  # no cause: an older record
        NodeQuarantined("n9", "declared dead: stream closed", 3),  # not SDC: left out
        NodeQuarantined("n7", "step 6 disagreed", 1, QuarantineCause.SDC),  # the cause decides, not the words
        NodeQuarantined("n8", "SDC: looks like it", 1, QuarantineCause.OPERATOR),
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
        ("quarantined", "n3", 1), ("quarantined", "n7", 1), ("restarted", "", 0),
    ]
    assert view["checks"] == [{"check_id": "c1", "seq": 7, "step": 7, "rank": 1, "suspect_node_id": "n2",
                               "verifier_node_id": "n4", "verdict": "match", "reported_digest": "x",
                               "recomputed_digest": "x", "generation": 0, "reason": "", "confirms_check_id": "",
                               "finished_seq": 8, "culprit_node_ids": [], "detail": "", "tainted_from_step": None,
                               "ranks": []}]
    text = sdc_text(view)
    assert "step 5 n3 rank 2 (minority): digest bad vs majority good" in text
    assert "quarantined n3 (evidence #1)" in text and "replayed on n4: match" in text


def test_an_empty_log_has_nothing_to_show():
    assert sdc_dict([]) == {"checks": [], "suspects": [], "verdicts": []}


def test_a_recompute_chain_shows_each_ranks_evidence_the_second_opinion_and_the_conviction():
    reported = (SdcRankDigests(1, "n2", "g1", "p"), SdcRankDigests(2, "n3", "g2-bad", "p"))
    recomputed = (SdcRankDigests(1, "s1", "g1", "q"), SdcRankDigests(2, "s1", "g2", "q"))
    again = tuple(SdcRankDigests(d.rank, "n1", d.grad_digest, d.param_digest) for d in recomputed)
    log = records(
        SdcCheckStarted("sdc-1", 5, 1, "n2", "s1", 1, "scheduled: every 5 steps", "", reported, (), ("n3", "n2"), 2),
        SdcCheckFinished("sdc-1", SdcVerdict.MISMATCH, "g1", "g1", recomputed, (), "step 5: rank 2 local gradient g2-bad"
                         " vs recomputed g2; asking n1 for a second opinion"),
        SdcCheckStarted("sdc-3", 5, 1, "n3", "n1", 1, "second opinion on sdc-1", "sdc-1", reported, recomputed,
                        ("n3", "n2"), 2),
        SdcCheckFinished("sdc-3", SdcVerdict.MISMATCH, "g1", "g1", again, ("n3",), "confirmed", 5),
        GenerationEnded(1, EndReason.NODE_QUARANTINED, "n3", 9, "SDC: recompute of step 5 (sdc-1, sdc-3): confirmed"),
        NodeQuarantined("n3", "SDC: recompute of step 5 (sdc-1, sdc-3): confirmed", 4),
    )
    view = sdc_dict(log)
    first, second = view["checks"]
    assert (first["verdict"], first["finished_seq"], first["culprit_node_ids"]) == ("mismatch", 2, [])
    assert [(r["rank"], r["node_id"], r["matches"]) for r in first["ranks"]] == [(1, "n2", False), (2, "n3", False)]
    assert first["ranks"][1]["recomputed_grad_digest"] == "g2" and first["ranks"][1]["reported_grad_digest"] == "g2-bad"
    assert (second["confirms_check_id"], second["culprit_node_ids"], second["tainted_from_step"]) == ("sdc-1", ["n3"], 5)
    assert [(v["action"], v["node_id"], v["evidence_seq"]) for v in view["verdicts"]] == [("quarantined", "n3", 4)]
    text = sdc_text(view)
    assert "sdc-3 gen 1 step 5 rank 1 of n3 replayed on n1 (second opinion on sdc-1): mismatch (#4), convicts n3," \
           " taints steps from 5" in text
    assert "rank 2 on n3: reported gradient g2-bad parameters p, recomputed g2 q" in text
    assert "asking n1 for a second opinion" in text
