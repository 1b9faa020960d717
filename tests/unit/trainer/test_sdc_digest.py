"""trainer.digest and trainer.sdc_inject: every single flipped bit changes the digest, and the
injector flips exactly the bit it was asked to, where and when it was asked to."""

from __future__ import annotations

import pytest
import torch

import ftsup.trainer.digest as digest_module
from ftsup.trainer.digest import Digester, param_digest, tensors_digest
from ftsup.trainer.sdc_inject import BitFlip, Injector, flip_bit_

INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64,
            torch.float16: torch.int16, torch.uint8: torch.uint8}


def named(**tensors: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    return list(tensors.items())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float16, torch.uint8])
def test_flipping_any_bit_of_any_element_changes_the_digest(dtype):
    torch.manual_seed(0)
    values = (torch.randn(5) * 4).to(dtype) if dtype.is_floating_point else torch.randint(0, 255, (5,)).to(dtype)
    other = torch.randn(3)
    base = tensors_digest(named(w=values, b=other))
    bits = values.element_size() * 8
    for index in range(values.numel()):
        for bit in range(bits):
            flipped = values.clone()
            flip_bit_(flipped, index, bit)
            assert flipped.view(INT_VIEW[dtype])[index] != values.view(INT_VIEW[dtype])[index]
            assert tensors_digest(named(w=flipped, b=other)) != base, (dtype, index, bit)


def test_the_digest_is_exact_bits_not_float_values():
    zero, negative_zero = torch.zeros(4), torch.zeros(4)
    negative_zero[2] = -0.0  # equal as floats, different bits
    assert tensors_digest(named(w=zero)) != tensors_digest(named(w=negative_zero))
    assert tensors_digest(named(w=zero.clone())) == tensors_digest(named(w=zero))


def test_positions_and_names_matter():
    a = torch.tensor([1.0, 2.0, 3.0])
    assert tensors_digest(named(w=a)) != tensors_digest(named(w=a.flip(0)))
    assert tensors_digest(named(w=a)) != tensors_digest(named(v=a))
    assert tensors_digest(named(w=a, v=a[:2])) != tensors_digest(named(w=a[:2], v=a))


def test_models_larger_than_one_chunk_still_catch_every_flip(monkeypatch):
    monkeypatch.setattr(digest_module, "CHUNK_WORDS", 7)
    monkeypatch.setattr(digest_module, "_multipliers", {})
    torch.manual_seed(1)
    tensors = named(a=torch.randn(10), b=torch.randn(9), c=torch.randn(4))
    base = tensors_digest(tensors)
    assert tensors_digest(tensors) == base and len(base) == 32
    for name, tensor in tensors:
        for index in range(tensor.numel()):
            flipped = tensor.clone()
            flip_bit_(flipped, index, 0)  # the lowest mantissa bit: a float sum would not see it
            swapped = [(n, flipped if n == name else t) for n, t in tensors]
            assert tensors_digest(swapped) != base, (name, index)


def test_the_device_holding_the_words_is_not_part_of_the_digest():
    # DDP replicas hold the same bits on different devices (local rank r on cuda:r): the label of
    # a device's sums must not reach the digest. Found on an H100: cuda:0 and CPU digests differed.
    tensors = named(w=torch.randn(6), b=torch.randn(2))
    digest = Digester(tensors)
    before = digest()
    for plan in digest._devices:
        plan.device = torch.device("cuda", 5)
    assert digest() == before == tensors_digest(tensors)


def test_a_digester_sees_in_place_updates_and_replaced_storage():
    model = torch.nn.Linear(4, 3)
    digest = Digester.of(model)
    before = digest()
    assert before == param_digest(model)
    flip_bit_(model.weight.data, 5, 3)
    assert digest() != before and digest() == param_digest(model)
    model.bias.data = torch.zeros(3)  # new storage: the plan is rebuilt
    assert digest() == param_digest(model)


def test_a_parameter_flip_changes_exactly_one_bit_on_the_chosen_rank_and_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    before = model.weight.detach().clone()
    elsewhere = Injector(BitFlip(step=3, rank=1, tensor="weight", index=2, bit=31), rank=0, generation=1, model=model)
    injector = Injector(BitFlip(step=3, rank=0, tensor="weight", index=2, bit=31), rank=0, generation=1, model=model)
    for step in (1, 2):
        injector.after_optimizer_step(step)
    assert torch.equal(model.weight, before) and injector.fired_at is None
    elsewhere.after_optimizer_step(3)
    assert torch.equal(model.weight, before)
    injector.after_optimizer_step(3)
    changed = (model.weight.detach().view(-1).view(torch.int32) ^ before.view(-1).view(torch.int32)).tolist()
    assert changed == [0, 0, -(1 << 31), 0, 0, 0, 0, 0] and injector.fired_at == 3
    assert model.weight.view(-1)[2].item() == -before.view(-1)[2].item()  # the sign bit


def gradients(model: torch.nn.Module, step: int, injector: Injector) -> torch.Tensor:
    injector.begin_step(step)
    model.zero_grad()
    model(torch.ones(1, 4)).sum().backward()
    return model.weight.grad.detach().clone()


def test_a_gradient_flip_hits_the_local_gradient_of_one_step_only():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    injector = Injector(BitFlip(step=2, rank=0, target="grad", tensor="weight", index=1, bit=23), 0, 1, model)
    clean = gradients(model, 1, injector)
    hit = gradients(model, 2, injector)
    after = gradients(model, 3, injector)
    assert torch.equal(clean, after) and injector.fired_at == 2
    diff = (hit.view(-1).view(torch.int32) ^ clean.view(-1).view(torch.int32)).tolist()
    assert diff == [0, 1 << 23, 0, 0, 0, 0, 0, 0]


def test_a_compute_flip_corrupts_the_module_output_once():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    injector = Injector(BitFlip(step=5, rank=0, target="compute", tensor="0", index=0, bit=30), 0, 1, model)
    x = torch.ones(1, 4)
    injector.begin_step(4)
    clean = model(x)
    injector.begin_step(5)
    assert not torch.equal(model(x), clean) and injector.fired_at == 5
    assert torch.equal(model(x), clean)  # one flip, not one per forward


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"target": "weights"}, "flip target must be one of"),
    ({"bit": 64}, "flip bit must be within [0, 63], got 64"),
    ({"step": 0}, "flip step/generation must be >= 1"),
])
def test_bad_flips_are_rejected_naming_the_value(kwargs, message):
    with pytest.raises(ValueError) as err:
        BitFlip(**{"step": 1, "rank": 0, **kwargs})
    assert message in str(err.value)


def test_flip_bit_rejects_bits_past_the_dtype():
    with pytest.raises(ValueError, match="bit 16 is out of range for torch.bfloat16"):
        flip_bit_(torch.zeros(2, dtype=torch.bfloat16), 0, 16)
