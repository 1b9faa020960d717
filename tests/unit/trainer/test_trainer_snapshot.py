"""trainer.snapshot and trainer.digest: exact round trips, corruption is caught, bits count."""

import random

import pytest
import torch

from ftsup.trainer import snapshot as snap
from ftsup.trainer.digest import param_digest


def make_model_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer


def train_one_step(model, optimizer):
    loss = model(torch.randn(3, 4)).square().mean() + random.random()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def test_round_trip_restores_parameters_optimizer_and_rngs_exactly():
    model, optimizer = make_model_and_optimizer()
    train_one_step(model, optimizer)
    torch.manual_seed(11)
    random.seed(12)
    state = snap.build_state(1, model, optimizer, {"k": 3})
    payload, sha = snap.encode(snap.HostBuffers().capture(state))
    train_one_step(model, optimizer)
    expected = (param_digest(model), torch.rand(3), random.random())

    other, other_opt = make_model_and_optimizer(seed=99)
    restored = snap.apply_state(snap.decode(payload, sha), other, other_opt)
    train_one_step(other, other_opt)

    assert (restored.step, restored.data_cursor, restored.extra) == (1, 1, {"k": 3})
    actual = (param_digest(other), torch.rand(3), random.random())
    assert actual[0] == expected[0]
    assert torch.equal(actual[1], expected[1]) and actual[2] == expected[2]


def test_capture_reuses_host_buffers_and_decouples_from_later_training():
    model, optimizer = make_model_and_optimizer()
    train_one_step(model, optimizer)
    buffers = snap.HostBuffers()
    first = buffers.capture(snap.build_state(1, model, optimizer))
    weight_buffer = first["model"]["0.weight"]
    before = weight_buffer.clone()
    train_one_step(model, optimizer)
    assert torch.equal(weight_buffer, before)  # a copy, not an alias of the live parameter

    second = buffers.capture(snap.build_state(2, model, optimizer))
    assert second["model"]["0.weight"] is weight_buffer
    assert torch.equal(weight_buffer, model[0].weight)
    assert buffers.nbytes > 0


def test_decode_rejects_a_payload_whose_sha256_does_not_match():
    model, optimizer = make_model_and_optimizer()
    payload, sha = snap.encode(snap.build_state(0, model, optimizer))
    flipped = bytes([payload[0] ^ 1]) + payload[1:]
    with pytest.raises(snap.SnapshotCorrupt, match=f"expected {sha}"):
        snap.decode(flipped, sha)


def test_decode_rejects_bytes_that_are_not_a_snapshot():
    import hashlib

    junk = b"not a snapshot"
    with pytest.raises(snap.SnapshotCorrupt, match="could not be loaded"):
        snap.decode(junk, hashlib.sha256(junk).hexdigest())


def test_digest_is_stable_and_changes_with_a_single_flipped_bit():
    model, _ = make_model_and_optimizer()
    before = param_digest(model)
    assert param_digest(model) == before and len(before) == 32
    with torch.no_grad():
        bits = model[2].bias.view(torch.int32)
        bits[1] ^= 1  # lowest mantissa bit of one value
    assert param_digest(model) != before
    with torch.no_grad():
        bits[1] ^= 1
    assert param_digest(model) == before


def test_digest_depends_on_parameter_names_and_shapes_not_only_bytes():
    a = torch.nn.Linear(2, 2, bias=False)
    b = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False))
    c = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        b[0].weight.copy_(a.weight)
        c.weight.copy_(a.weight.reshape(1, 4))
    assert len({param_digest(a), param_digest(b), param_digest(c)}) == 3


def test_digest_handles_bfloat16_and_zero_dim_parameters():
    module = torch.nn.Module()
    module.scale = torch.nn.Parameter(torch.tensor(2.0))
    module.w = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    assert len(param_digest(module)) == 32
