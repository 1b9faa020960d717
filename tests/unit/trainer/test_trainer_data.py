"""ftsup.trainer.core.data: the corpus and batch order are pure functions of their arguments."""

import ast
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftsup.trainer.core import data

CORPUS_LEN = 10_000
# Offsets of (seed 0, step 1, rank 0, 4 x 32) as first computed; see the pinning test.
PINNED_OFFSETS = [7313, 651, 5866, 954]


def test_corpus_is_the_same_for_the_same_seed_and_differs_between_seeds():
    assert data.generate_corpus(3, 5_000) == data.generate_corpus(3, 5_000)
    assert data.generate_corpus(3, 5_000) != data.generate_corpus(4, 5_000)


def test_corpus_has_the_requested_length_and_only_vocabulary_characters():
    text = data.generate_corpus(0, 12_345)
    assert len(text) == 12_345
    assert set(text) <= set(data.VOCAB)
    assert data.decode(data.encode(text)) == text


def test_default_corpus_is_a_few_hundred_kilobytes_of_sentences():
    text = data.generate_corpus(0)
    assert 100_000 <= len(text) <= 1_000_000
    assert text.count(".") > 1_000 and text.count("\n") > 100


def test_encode_rejects_a_character_outside_the_vocabulary_naming_it():
    with pytest.raises(ValueError, match="'#'"):
        data.encode("ab#")


@given(
    seed=st.integers(0, 2**32),
    step=st.integers(0, 10**6),
    rank=st.integers(0, 4096),
    batch_size=st.integers(1, 16),
    seq_len=st.integers(1, 64),
)
def test_batch_offsets_are_deterministic_and_in_range(seed, step, rank, batch_size, seq_len):
    offsets = data.batch_offsets(seed, step, rank, batch_size, seq_len, CORPUS_LEN)
    assert offsets == data.batch_offsets(seed, step, rank, batch_size, seq_len, CORPUS_LEN)
    assert len(offsets) == batch_size
    assert all(o >= 0 and o + seq_len + 1 <= CORPUS_LEN for o in offsets)


def test_different_steps_ranks_and_seeds_get_different_batches():
    base = data.batch_offsets(0, 5, 1, 8, 32, CORPUS_LEN)
    assert data.batch_offsets(0, 6, 1, 8, 32, CORPUS_LEN) != base
    assert data.batch_offsets(0, 5, 2, 8, 32, CORPUS_LEN) != base
    assert data.batch_offsets(1, 5, 1, 8, 32, CORPUS_LEN) != base


def test_batch_offsets_are_pinned_across_python_processes_and_versions():
    # A changed value here means restarts would no longer replay old runs' data order.
    assert data.batch_offsets(0, 1, 0, 4, 32, CORPUS_LEN) == PINNED_OFFSETS


def test_the_smallest_corpus_allows_only_offset_zero():
    assert data.batch_offsets(0, 1, 0, 3, 5, 6) == [0, 0, 0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"step": -1}, "step must be >= 0"),
        ({"rank": -1}, "rank must be >= 0"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"seq_len": 0}, "seq_len must be >= 1"),
        ({"corpus_len": 32}, r"corpus_len \(32\) must be at least seq_len \+ 1 \(33\)"),
    ],
)
def test_batch_offsets_reject_out_of_range_arguments_naming_the_value(kwargs, message):
    args = {"seed": 0, "step": 1, "rank": 0, "batch_size": 8, "seq_len": 32, "corpus_len": 1000}
    with pytest.raises(ValueError, match=message):
        data.batch_offsets(**(args | kwargs))


def test_data_module_imports_only_the_standard_library():
    tree = ast.parse(pathlib.Path(data.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"__future__", "hashlib", "random"}

