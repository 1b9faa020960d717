"""ftsup.trainer.integrations.state: the checks and arithmetic both framework adapters rely on."""

from collections import OrderedDict

import numpy as np
import pytest
import torch

from ftsup.trainer.integrations.state import (
    Protected,
    ResumePosition,
    framework_state,
    plain,
    restore_parts,
    resume_position,
)
from tests.unit.trainer.test_trainer_session import (
    FakeClient,
    make_session,
    model_and_optimizer,
)


class AttributeDict(dict):
    pass


def test_plain_turns_mapping_subclasses_into_dicts_and_keeps_tensors_and_scalars():
    tensor = torch.ones(2)
    out = plain({"a": AttributeDict(x=1), "b": OrderedDict(y=[1.5, "s", None, (True, tensor)])})
    assert type(out["a"]) is dict and out["a"] == {"x": 1}
    assert type(out["b"]) is dict and out["b"]["y"][3][1] is tensor


def test_plain_refuses_what_a_weights_only_load_cannot_read_naming_where():
    with pytest.raises(TypeError, match=r"extra\['sched'\]\['fn'\] is a numpy.ndarray"):
        plain({"sched": {"fn": np.zeros(2)}})
    with pytest.raises(TypeError, match="key of type float"):
        plain({1.5: 0})


@pytest.mark.parametrize(("step", "per_epoch", "accumulation", "expected"), [
    (0, 5, 1, ResumePosition(0, 0)),
    (3, 5, 1, ResumePosition(0, 3)),
    (5, 5, 1, ResumePosition(1, 0)),
    (12, 5, 2, ResumePosition(2, 4)),
])
def test_resume_position_is_epochs_done_and_batches_consumed(step, per_epoch, accumulation, expected):
    assert resume_position(step, per_epoch, accumulation) == expected


def test_resume_position_rejects_impossible_loops():
    with pytest.raises(ValueError, match="update_steps_per_epoch=0"):
        resume_position(3, 0)


def test_restore_parts_hands_back_the_snapshot_pieces_without_live_objects():
    client = FakeClient()
    session = make_session(client)
    model, optimizer = model_and_optimizer()
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    session.snapshot(7, framework_state(Protected(model, optimizer, {})), extra={"framework": {"k": 1}})
    session.wait_for_snapshots()
    assert restore_parts(make_session(client)) is None  # a fresh start asks nothing
    client.restore_blob = client.calls[-1][1]
    parts = restore_parts(make_session(client, FTSUP_RESTORE_STEP="7", FTSUP_GENERATION="4"))
    assert parts is not None and parts.step == 7 and parts.extra == {"framework": {"k": 1}}
    assert torch.equal(parts.model_state["weight"], model.weight)
    assert parts.optimizer_state["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    assert set(parts.rng) == {"torch_cpu", "cuda", "python"}
