"""Every bound the supervisor's core enforces, in one place, each with why it is where it is.

Two kinds: sanity limits on what a sender may claim (past them a report is corrupt or hostile and
is refused with the limit named), and caps on what the core remembers (past them the oldest goes:
memory stays bounded whatever a fleet or an attacker sends). Pure constants; nothing here reads
configuration, which validates its own ranges (core/config.py).
"""

from __future__ import annotations

# -- what a sender may claim (admission.py refuses past these) ------------------------------------

# Node ids: their form and length are common/node_id.py's (one rule for the agent's flags, the
# server's Hello checks and admission.py).
# Steps are counted one optimizer step at a time: 2^53 - 1 is ~285 million years of 1 ms steps,
# and the largest count that stays exact as a float (JSON, Prometheus). Larger is a corrupt report.
MAX_STEP = (1 << 53) - 1
MAX_STEP_TIME_S = 86_400.0  # a day per optimizer step: slower is a stuck clock, not training
MAX_TOKENS_PER_STEP = 1 << 40  # far above any real batch; larger is a corrupt report
MAX_HUNG_S = 1e9  # about 31 years: a larger silence or limit is a corrupt report
MAX_XID_CODE = 65_535  # NVIDIA's Xid codes are 16-bit
MAX_PCI_BUS_ID = 64  # characters; a PCI bus id is "0000:3b:00.0" (12)
MAX_TEXT = 4096  # characters of free text (an Xid line, an operator's reason, an error) kept in the log
MAX_DIGEST = 128  # characters of a hex digest; far above the 32 of trainer.digest
MAX_AGGREGATE_REPORTS = 1 << 20  # a world of a million ranks; a larger aggregate is corrupt
MAX_CHECKPOINT_REASON = 1000  # characters of a checkpoint request's reason kept in the log
MAX_SNAPSHOT_MEMORY_BYTES = 1 << 50  # 1 PiB: no node's snapshot store is larger; a larger figure is corrupt
MAX_RANKS_PER_NODE_REPORT = 1 << 20  # ranks one agent's snapshot store may answer for (held copies included)
MAX_HEARD_NODES = 1 << 17  # nodes one liveness summary may name: every node of a 100k-GPU fleet, 10x over
MAX_SHARD_NAME = 256  # characters of a link shard's name (its advertised host:port) in a liveness summary
SNAPSHOT_MEMORY_BASES = frozenset({"no_sizes_yet", "derived", "ram_cap", "flag_cap"})  # agent/core/snapshot_budget.py

# -- what the core remembers (soft state: oldest dropped past these) ------------------------------

XID_HISTORY_S = 7 * 24 * 3600.0  # longer than any repeat window of the Xid policy
XID_HISTORY_MAX = 256  # Xids remembered per node: far more than any repeat rule counts
MAX_HELD_EXITS = 256  # a whole node's ranks and then some; later ones add nothing to the attribution
MAX_HOLDING_LEAD = 1024  # steps a snapshot holding may run ahead of progress; further is absurd: ignored
# Uncommitted steps whose holdings are kept (each is arrays over the generation's ranks, ~1 MB at
# 100,000 ranks: core/step_holdings.py); a fleet holds one to three. Past it the step farthest
# from the newest reported one goes (soft._room_for).
MAX_HOLDING_STEPS = 32
MAX_OPEN_STEPS = 64  # steps waiting for their last rank's report; older ones are given up
MAX_CLEAR_STEPS = 256  # agreed steps remembered for commits (commits trail steps by ~1)
MAX_SHARDS = 1024  # link shards whose last summary the detector remembers (a fleet runs a handful)
KEEP_CHECKPOINT_COSTS = 64  # measured checkpoint costs the Young/Daly policy remembers (it reads the newest)

# -- the supervisor loop's queues (runtime.py) -----------------------------------------------------

# Inputs from agent streams that may wait in the loop's queue at once. A stream that sends faster
# than the loop decides waits here (and, through gRPC flow control, so does its sender) instead of
# growing memory. Far above a healthy fleet's backlog: 12,500 nodes' heartbeats and step reports.
STREAM_INPUT_CAPACITY = 50_000
# Hellos decided and appended together at most (a connecting fleet's burst): one fsync'd append
# and one planner pass per batch. Large enough that 12,500 nodes register in a few dozen appends,
# small enough that one batch keeps the loop from heartbeats for well under a heartbeat interval.
HELLO_BATCH = 512
# Directives built, encoded and queued in one turn of the leader's loop at most. A generation's
# start directs every node: at 12,500 nodes that is ~0.8 s of CPU on an idle core (7-9 s of stall
# on the shared bench machine) in one turn, during which no heartbeat, summary or report is read.
# Past this many, the rest are built a slice per turn, each from the state of its turn, with an
# input handled between slices (~65 ms a slice at 12,500 nodes, idle).
PUSH_SLICE = 1024
