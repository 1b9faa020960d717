"""Deterministic training data: a synthetic corpus and the batch order, as pure functions.

Owns what a restarted rank needs to see exactly the batches the uninterrupted run would have
seen: the corpus text is generated from a seed (no download, no files) and the offsets of the
batch for (seed, step, rank) are a pure function of those values, so the data cursor is just the
step number. Stdlib only: no torch, no I/O, no clock, no global `random`, and never Python's
salted `hash()` (it differs between processes).
"""

from __future__ import annotations

import hashlib
import random

# Character vocabulary, fixed so token ids never depend on the generated text.
VOCAB = "\n !',.;?" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
VOCAB_SIZE = len(VOCAB)
_CHAR_TO_ID = {ch: i for i, ch in enumerate(VOCAB)}

_DETERMINERS = ("the", "a", "every", "one", "that", "this", "some", "no")
_ADJECTIVES = (
    "quiet", "old", "bright", "small", "patient", "broken", "green", "distant", "careful",
    "heavy", "silver", "warm", "strange", "narrow", "early", "hollow", "gentle", "restless",
)
_NOUNS = (
    "river", "node", "garden", "engineer", "lantern", "machine", "village", "signal", "baker",
    "mountain", "letter", "window", "kernel", "sailor", "forest", "clock", "bridge", "student",
    "harbor", "record", "cluster", "teacher", "storm", "library",
)
_VERBS = (
    "watches", "carries", "finds", "repairs", "remembers", "follows", "builds", "answers",
    "crosses", "guards", "counts", "greets", "restores", "measures", "hears", "paints",
)
_ADVERBS = ("slowly", "again", "often", "quietly", "at last", "before dawn", "every day")
_PREPOSITIONS = ("near", "under", "behind", "beyond", "beside", "across", "inside", "above")
_CONJUNCTIONS = ("and", "but", "while", "because", "so")
_ENDINGS = (".", ".", ".", "!", "?")


def _noun_phrase(rng: random.Random) -> str:
    words = [rng.choice(_DETERMINERS)]
    if rng.random() < 0.6:
        words.append(rng.choice(_ADJECTIVES))
    words.append(rng.choice(_NOUNS))
    if rng.random() < 0.25:
        words += [rng.choice(_PREPOSITIONS), rng.choice(_DETERMINERS), rng.choice(_NOUNS)]
    return " ".join(words)


def _clause(rng: random.Random) -> str:
    clause = f"{_noun_phrase(rng)} {rng.choice(_VERBS)} {_noun_phrase(rng)}"
    if rng.random() < 0.3:
        clause += " " + rng.choice(_ADVERBS)
    return clause


def _sentence(rng: random.Random) -> str:
    text = _clause(rng)
    if rng.random() < 0.35:
        text += f"{rng.choice(('', ','))} {rng.choice(_CONJUNCTIONS)} {_clause(rng)}"
    return text[0].upper() + text[1:] + rng.choice(_ENDINGS)


def generate_corpus(seed: int, n_chars: int = 200_000) -> str:
    """English-like text of exactly `n_chars` characters drawn from a small seeded grammar."""
    if n_chars < 1:
        raise ValueError(f"n_chars must be >= 1, got {n_chars}")
    rng = random.Random(_stable_seed("corpus", seed))
    parts: list[str] = []
    size = 0
    while size < n_chars:
        paragraph = " ".join(_sentence(rng) for _ in range(rng.randint(3, 7))) + "\n"
        parts.append(paragraph)
        size += len(paragraph)
    return "".join(parts)[:n_chars]


def encode(text: str) -> list[int]:
    """Token ids of `text` (one per character); rejects characters outside VOCAB."""
    try:
        return [_CHAR_TO_ID[ch] for ch in text]
    except KeyError as exc:
        raise ValueError(f"character {exc.args[0]!r} is not in the vocabulary") from None


def decode(tokens: list[int]) -> str:
    """Inverse of `encode`."""
    return "".join(VOCAB[t] for t in tokens)


def batch_offsets(
    seed: int, step: int, rank: int, batch_size: int, seq_len: int, corpus_len: int
) -> list[int]:
    """Start offsets of the `batch_size` sequences rank `rank` trains on at step `step`.

    Each offset `o` satisfies 0 <= o and o + seq_len + 1 <= corpus_len, so inputs are
    tokens[o : o + seq_len] and targets tokens[o + 1 : o + seq_len + 1]. The same arguments give
    the same offsets in any process, which is what lets a restart replay the data order.
    """
    for name, value, low in (
        ("step", step, 0), ("rank", rank, 0), ("batch_size", batch_size, 1), ("seq_len", seq_len, 1)
    ):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if corpus_len < seq_len + 1:
        raise ValueError(f"corpus_len ({corpus_len}) must be at least seq_len + 1 ({seq_len + 1})")
    rng = random.Random(_stable_seed("batch", seed, step, rank))
    high = corpus_len - seq_len - 1
    return [rng.randint(0, high) for _ in range(batch_size)]


def _stable_seed(purpose: str, *values: int) -> int:
    # A process-independent combination of the inputs (blake2b, not the salted builtin hash).
    text = ":".join([purpose, *(str(int(v)) for v in values)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
