"""A synthetic masked-language-model task that a small encoder learns in minutes on a CPU.

Every sequence repeats a random motif of 2 to 4 tokens (tokens 0 and 1 are PAD and
MASK; the motif's are 2 .. vocab_size - 1).  About 15% of the positions (at least two)
are replaced by MASK, as in BERT's pre-training; the model predicts the original token
at each masked position, which the unmasked positions of the same phase determine --
a copy-by-attention task.  Masks are drawn once per example ("static masking"), so a run is
a pure function of its seed.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

PAD, MASK = 0, 1
MASK_FRACTION = 0.15
MIN_PERIOD, MAX_PERIOD = 2, 4


def make_examples(count: int, seq_len: int, vocab_size: int, seed: int):
    """``(input_ids, target_ids, mask_weights)``: int32, int32, float32 arrays ``[count, seq_len]``."""
    if vocab_size < 4 or seq_len < 4:
        raise ValueError("the task needs vocab_size >= 4 and seq_len >= 4")
    rng = np.random.default_rng(seed)
    motifs = rng.integers(2, vocab_size, (count, MAX_PERIOD))
    periods = rng.integers(MIN_PERIOD, MAX_PERIOD + 1, (count, 1))
    phases = np.arange(seq_len) % periods
    targets = np.take_along_axis(motifs, phases, axis=1).astype(np.int32)
    masked = max(2, int(round(MASK_FRACTION * seq_len)))
    order = np.argsort(rng.random((count, seq_len)), axis=1)[:, :masked]
    weights = np.zeros((count, seq_len), np.float32)
    np.put_along_axis(weights, order, 1.0, axis=1)
    inputs = np.where(weights > 0, MASK, targets).astype(np.int32)
    return inputs, targets, weights


def dataset(count: int, seq_len: int, vocab_size: int, seed: int, batch_size: int,
            training: bool) -> tf.data.Dataset:
    """Batches of ``({"input_ids"}, {"target_ids", "mask_weights"})``, repeating for ever.

    Training and evaluation examples come from different seeds.
    """
    inputs, targets, weights = make_examples(count, seq_len, vocab_size, seed if training else seed + 1)
    data = tf.data.Dataset.from_tensor_slices(({"input_ids": inputs},
                                               {"target_ids": targets, "mask_weights": weights}))
    if training:
        data = data.shuffle(count, seed=seed)
    return data.repeat().batch(batch_size, drop_remainder=True).prefetch(2)
