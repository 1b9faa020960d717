"""Which steps a supervised job checkpoints, and the id each checkpoint gets: one rule, shared.

The supervisor's core decides commits under these ids and the trainers write under them, so a
second copy that drifted would leave every rank's shards where the supervisor never looks. Pure
(no I/O, no clock): the supervisor's core imports it as it imports common/node_id.py.
"""

from __future__ import annotations


def checkpoint_id_for(step: int, generation: int) -> str:
    """The checkpoint of `step` in `generation`: ids sort by step (the manifest's `step-NNNNNNNNNN-`
    form, checkpoint/manifest.py, with the nonce `g<generation>`), and a step saved again in a
    later generation gets a fresh id."""
    return f"step-{step:010d}-g{generation}"


def is_due(step: int, every_steps: int) -> bool:
    """Is `step` a checkpoint step of the fixed cadence (FTSUP_CHECKPOINT_EVERY_STEPS; 0: none)?"""
    return every_steps > 0 and step > 0 and step % every_steps == 0
