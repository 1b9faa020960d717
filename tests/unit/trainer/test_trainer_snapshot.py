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


def big_state() -> dict:
    """A captured-like state: large tensors of every kind a snapshot carries raw, small ones and
    others that stay in the skeleton, in dicts, lists and tuples."""
    torch.manual_seed(3)
    n = snap.RAW_MIN_BYTES  # elements: every dtype below is at least RAW_MIN_BYTES
    return {
        "format": snap.FORMAT_VERSION, "step": 4,
        "objects": {"model": {"w": torch.randn(n // 64, 64), "b16": torch.randn(n).to(torch.bfloat16),
                              "mask": torch.rand(n) > 0.5, "ids": torch.arange(n, dtype=torch.int64),
                              "c": torch.randn(n, dtype=torch.complex64), "small": torch.randn(3),
                              "scalar": torch.tensor(2.5), "empty": torch.empty(0, 4)},
                    "optimizer": {"state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.randn(n)}},
                                  "param_groups": [{"lr": 0.1, "params": [0]}]}},
        "rng": {"torch_cpu": torch.get_rng_state(), "python": [3, [1, 2], None]},
        # A transposed matrix is not contiguous: it stays in the skeleton (torch.save writes it).
        "extra": ({"nested": [torch.randn(n), torch.randn(64, n // 64).t()]}, "text", None),
    }


def assert_same(actual, expected) -> None:
    assert type(actual) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape and torch.equal(actual, expected)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            assert_same(actual[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e)
    else:
        assert actual == expected


def test_the_raw_container_round_trips_every_dtype_shape_and_container_exactly():
    state = big_state()
    parts = snap.serialize_parts(state)
    payload = b"".join(parts)
    assert payload.startswith(snap.RAW_MAGIC) and len(parts) > 5  # the large tensors went raw
    assert_same(snap.load(payload), state)
    assert_same(snap.load(memoryview(payload).toreadonly()), state)  # as a restore hands it over


def test_raw_parts_are_views_of_the_tensors_and_aligned():
    weight = torch.randn(snap.RAW_MIN_BYTES)
    parts = snap.serialize_parts({"format": snap.FORMAT_VERSION, "w": weight})
    offset = 0
    views = []
    for part in parts:
        if isinstance(part, memoryview):
            views.append((offset, part))
        offset += memoryview(part).nbytes
    assert len(views) == 1 and views[0][0] % snap.RAW_ALIGN == 0
    weight[0] = 42.0  # no copy was made: the part shows the change
    assert torch.frombuffer(bytearray(views[0][1][:4]), dtype=torch.float32).item() == 42.0


def test_a_small_state_goes_whole_into_the_skeleton_and_round_trips():
    model, optimizer = make_model_and_optimizer()
    train_one_step(model, optimizer)
    state = snap.HostBuffers().capture(snap.build_state(1, model, optimizer))
    parts = snap.serialize_parts(state)
    assert len(parts) == 1
    restored = snap.load(parts[0])
    assert_same(restored["model"], state["model"])


@pytest.mark.parametrize("cut", [-1, -100, 8, 20])
def test_a_truncated_raw_payload_is_refused_not_loaded(cut):
    payload = b"".join(snap.serialize_parts(big_state()))
    with pytest.raises(snap.SnapshotCorrupt):
        snap.load(payload[:cut])


def test_a_raw_payload_whose_table_does_not_fit_its_state_is_refused():
    import io

    payload = b"".join(snap.serialize_parts(big_state()))
    _magic, length = snap._RAW_PREFIX.unpack_from(payload, 0)
    skeleton = torch.load(io.BytesIO(payload[16:16 + length]), weights_only=True)
    path, dtype, shape, offset, nbytes = skeleton["tensors"][0]
    for table in ([(("objects", "nowhere"), dtype, shape, offset, nbytes)],  # no None stands there
                  [(path, "float32", [nbytes], offset, nbytes)],  # the size disagrees with the shape
                  [(path, "no_such_dtype", shape, offset, nbytes)]):
        out = io.BytesIO()
        torch.save({**skeleton, "tensors": table + skeleton["tensors"][1:]}, out)
        forged = snap._RAW_PREFIX.pack(snap.RAW_MAGIC, len(out.getvalue())) + out.getvalue()
        forged += bytes(-len(forged) % snap.RAW_ALIGN) + payload[snap._aligned(16 + length):]
        with pytest.raises(snap.SnapshotCorrupt):
            snap.load(forged)


def test_torch_save_payloads_still_load():
    model, optimizer = make_model_and_optimizer()
    state = snap.HostBuffers().capture(snap.build_state(1, model, optimizer))
    assert_same(snap.load(snap.serialize(state))["model"], state["model"])
