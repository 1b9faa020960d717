"""Hypothesis strategies for every core event kind (shared by the codec and core property tests)."""

from __future__ import annotations

from hypothesis import strategies as st

from ftsup.supervisor.core import events as ev

text = st.text(max_size=12)
u64 = st.integers(0, 2**63)
u32 = st.integers(0, 2**31)
i32 = st.integers(-(2**31), 2**31 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)

assignment = st.builds(ev.RankAssignment, text, st.lists(u32, max_size=4).map(tuple), text)
restore = st.builds(ev.RankRestore, u32, st.sampled_from(ev.RestoreKind), text)
rank_digests = st.lists(st.builds(ev.SdcRankDigests, u32, text, text, text), max_size=3).map(tuple)

STRATEGIES = {
    ev.NodeRegistered: st.builds(ev.NodeRegistered, text, u64, st.sampled_from(ev.NodeRole), text, u32, u32, text),
    ev.NodeSuspected: st.builds(ev.NodeSuspected, text, text, finite),
    ev.NodeCleared: st.builds(ev.NodeCleared, text, text),
    ev.NodeDeclaredDead: st.builds(ev.NodeDeclaredDead, text, text, finite),
    ev.NodeQuarantined: st.builds(ev.NodeQuarantined, text, text, u64),
    ev.GenerationStarted: st.builds(
        ev.GenerationStarted, u64, st.lists(assignment, max_size=3).map(tuple), u32, text, u32,
        st.none() | u64, u64, st.lists(restore, max_size=3).map(tuple), text, text, text, text,
    ),
    ev.GenerationRunning: st.builds(ev.GenerationRunning, u64, u64),
    ev.GenerationEnded: st.builds(ev.GenerationEnded, u64, st.sampled_from(ev.EndReason), text, u64, text, finite,
                                  st.none() | u32, st.none() | i32, text),
    ev.SnapshotCommitted: st.builds(ev.SnapshotCommitted, u64, u64),
    ev.JobCompleted: st.builds(ev.JobCompleted, u64, u64, text),
    ev.JobFailed: st.builds(ev.JobFailed, u64, st.sampled_from(ev.EndReason), text, st.none() | u32,
                            st.none() | i32, text, text, u64, u64),
    ev.XidReported: st.builds(ev.XidReported, text, text, st.none() | u32, u32, st.sampled_from(ev.XidAction), text,
                              st.booleans()),
    ev.NodeUnquarantined: st.builds(ev.NodeUnquarantined, text, text, text),
    ev.NodeDrained: st.builds(ev.NodeDrained, text, text, text),
    ev.StragglerDetected: st.builds(ev.StragglerDetected, text, u32, finite, u32, u32, text),
    ev.CheckpointStarted: st.builds(ev.CheckpointStarted, text, u64, u64, u32, text),
    ev.CheckpointShardWritten: st.builds(ev.CheckpointShardWritten, text, u32, text, text, u64),
    ev.CheckpointCommitted: st.builds(ev.CheckpointCommitted, text, u64, text, text),
    ev.CheckpointAborted: st.builds(ev.CheckpointAborted, text, text),
    ev.CheckpointRequested: st.builds(ev.CheckpointRequested, text, u64, u64, text),
    ev.SdcCheckStarted: st.builds(ev.SdcCheckStarted, text, u64, u32, text, text, u64, text, text, rank_digests,
                                  rank_digests, st.lists(text, max_size=3).map(tuple), u32),
    ev.SdcCheckFinished: st.builds(ev.SdcCheckFinished, text, st.sampled_from(ev.SdcVerdict), text, text, rank_digests,
                                   st.lists(text, max_size=3).map(tuple), text, st.none() | u64),
    ev.SdcSuspected: st.builds(ev.SdcSuspected, text, u32, u64, text, text),
    ev.OperatorCommand: st.builds(ev.OperatorCommand, text, st.lists(text, max_size=3).map(tuple), text, text),
    ev.LeaderElected: st.builds(ev.LeaderElected, u64, text, u64),
}
