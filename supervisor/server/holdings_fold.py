"""ShardHoldingsFold on the wire -> the core's HoldingsFold (issue 14, the leader's side).

A link shard packs its sessions' back-to-back SnapshotHoldings of one step into one message
(common/holdings_fold_pack.py). Decoded here once, column by column, into a HoldingsFold whose
parts are the SnapshotHoldings snapshot_holdings.to_input makes of the same holdings one by one
(the holder is the part's session's node), so each part is admitted, refused and decided exactly as
its own message would be: the usual fold on its columns (Core.step_holdings_fold), any other
part by part (Core.step_holdings).

The shard packs only well-formed holdings; a fold that is not (a shard's bug) raises
MalformedHoldings for all its parts, as does a part of more ranks than one node reports.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ftsup.supervisor.core.inputs import HoldingsFold
from ftsup.supervisor.core.limits import MAX_RANKS_PER_NODE_REPORT
from ftsup.supervisor.server.snapshot_holdings import MalformedHoldings
from ftsup.v1 import shard_pb2


def to_input(node_ids: Sequence[str], message: shard_pb2.ShardHoldingsFold) -> HoldingsFold:
    """The fold's columns, its parts' nodes `node_ids` (those of the message's sessions, in order)."""
    counts = tuple(message.counts)
    if not counts or len(counts) != len(node_ids):
        raise MalformedHoldings(f"a holdings fold of {len(counts)} parts for {len(node_ids)} sessions")
    if min(counts) < 1:
        raise MalformedHoldings("a holdings fold with a part of no ranks")
    if max(counts) > MAX_RANKS_PER_NODE_REPORT:
        raise MalformedHoldings(f"a holdings fold with a part of {max(counts)} ranks"
                                f" (at most {MAX_RANKS_PER_NODE_REPORT})")
    total = sum(counts)
    ranks, sizes, digests = message.ranks, message.size_bytes, message.sha256
    if not len(ranks) == len(sizes) == len(digests) == total:
        raise MalformedHoldings(f"a holdings fold of {total} entries has {len(ranks)} ranks, {len(sizes)} sizes"
                                f" and {len(digests)} digests")
    return HoldingsFold(tuple(node_ids), message.generation, message.step, counts,
                        np.fromiter(ranks, dtype=np.int64, count=total), np.fromiter(sizes, dtype=np.int64, count=total),
                        tuple(digests))
