"""Session.snapshot(state)/restore(state) of named objects in one process (trainer/state.py): several
optimizers, schedulers, a GradScaler and a StatefulDataLoader restored exactly; values a restore
could not load refused at snapshot() naming their key. FSDP2 and resharding: tests/integration/
test_state_fsdp.py."""

from __future__ import annotations

import fractions

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from ftsup.trainer import state as state_module
from ftsup.trainer.session import StateError
from tests.unit.trainer.test_trainer_session import FakeClient, make_session


def build(seed: int = 0) -> dict[str, object]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    body = torch.optim.AdamW(model[0].parameters(), lr=1e-2)
    head = torch.optim.SGD(model[1].parameters(), lr=1e-1, momentum=0.9)
    data = torch.utils.data.TensorDataset(torch.arange(40, dtype=torch.float32).view(20, 2).repeat(1, 2))
    return {
        "model": model, "body": body, "head": head,
        "body_lr": torch.optim.lr_scheduler.StepLR(body, step_size=2, gamma=0.5),
        "head_lr": torch.optim.lr_scheduler.CosineAnnealingLR(head, T_max=10),
        "scaler": torch.amp.GradScaler("cpu", init_scale=1024.0),
        "data": StatefulDataLoader(data, batch_size=3, shuffle=True,
                                   generator=torch.Generator().manual_seed(seed + 1)),
    }


def train(state: dict[str, object], batches, steps: int) -> list[torch.Tensor]:
    seen = []
    for _ in range(steps):
        (x,) = next(batches)
        seen.append(x)
        loss = state["model"](x).square().mean()
        state["scaler"].scale(loss).backward()
        for name in ("body", "head"):
            state["scaler"].step(state[name])
            state[name].zero_grad()
        state["scaler"].update()
        state["body_lr"].step()
        state["head_lr"].step()
    return seen


def test_named_state_round_trips_exactly_and_the_data_loader_resumes_where_it_was() -> None:
    client = FakeClient()
    session = make_session(client)
    state = build()
    batches = iter(state["data"])
    train(state, batches, 3)
    session.snapshot(3, state, extra={"tokens": 12})
    session.wait_for_snapshots()
    at_3 = {name: state[name].state_dict() for name in ("body_lr", "head_lr", "scaler")}
    after = train(state, batches, 2)  # what the lost run would have seen next
    expected = {k: v.clone() for k, v in state["model"].state_dict().items()}
    session.close()

    [held] = [value for call, value in client.calls if call == "PutSnapshot"]
    client = FakeClient()
    client.restore_blob = held
    session = make_session(client, FTSUP_RESTORE_STEP="3")
    fresh = build(seed=5)  # other weights, other shuffle: all must come from the snapshot
    assert session.restore(fresh) == 3
    assert session.restored_extra == {"tokens": 12}
    assert {name: fresh[name].state_dict() for name in at_3} == at_3
    resumed = train(fresh, iter(fresh["data"]), 2)
    assert all(torch.equal(a, b) for a, b in zip(after, resumed, strict=True))
    for key, value in fresh["model"].state_dict().items():
        assert torch.equal(value, expected[key]), key
    session.close()


@pytest.mark.parametrize(("extra", "where", "hint"), [
    ({"cursor": np.int64(3)}, "extra['cursor']", "x.item()"),
    ({"rows": [1, np.zeros(2)]}, "extra['rows'][1]", "torch.from_numpy"),
    ({"f": lambda: 1}, "extra['f']", "functions and lambdas"),
    ({"ratio": fractions.Fraction(1, 3)}, "extra['ratio']", "state_dict()"),
    ({(1, 2): 0}, "extra has a key (1, 2)", "only str and int keys"),
])
def test_snapshot_refuses_what_a_restore_could_not_load_naming_the_key(extra, where, hint) -> None:
    client = FakeClient()
    session = make_session(client)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(StateError) as caught:
        session.snapshot(1, model, torch.optim.SGD(model.parameters(), lr=0.1), extra=extra)
    assert where in str(caught.value) and hint in str(caught.value)
    assert not [c for c in client.calls if c[0] == "PutSnapshot"]  # nothing handed off
    session.close()


def test_a_stateful_object_holding_numpy_is_refused_with_its_state_path() -> None:
    class Sampler:
        def state_dict(self):
            return {"order": np.arange(4)}

        def load_state_dict(self, state):
            pass

    session = make_session(FakeClient())
    model = torch.nn.Linear(2, 2)
    with pytest.raises(StateError, match=r"state\['sampler'\]\['order'\] is a numpy.ndarray"):
        session.snapshot(1, {"model": model, "sampler": Sampler()})
    session.close()


def test_state_names_objects_it_can_handle_and_refuses_the_rest_clearly() -> None:
    model = torch.nn.Linear(2, 2)
    stray = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(StateError, match="expected an nn.Module, an optimizer"):
        state_module.objects_of({"model": model, "step": 3})
    with pytest.raises(StateError, match="optimizes parameters of no single module"):
        state_module.collect({"model": model, "optimizer": stray})
    with pytest.raises(TypeError, match="optimizer is required"):
        state_module.objects_of(model)


def test_restore_names_the_objects_a_snapshot_lacks() -> None:
    client = FakeClient()
    session = make_session(client)
    model = torch.nn.Linear(2, 2)
    session.snapshot(1, model, torch.optim.SGD(model.parameters(), lr=0.1))
    session.wait_for_snapshots()
    session.close()
    client2 = FakeClient()
    [client2.restore_blob] = [value for call, value in client.calls if call == "PutSnapshot"]
    session = make_session(client2, FTSUP_RESTORE_STEP="1")
    other = torch.nn.Linear(2, 2)
    with pytest.raises(StateError, match=r"missing from the snapshot: \['scaler'\]"):
        session.restore({"model": other, "optimizer": torch.optim.SGD(other.parameters(), lr=0.1),
                         "scaler": torch.amp.GradScaler("cpu")})
    session.close()

