"""Gradient tensor sets of real models, as shapes: what the fused op sees per training step.

TensorFlow-free (numpy only), so the GPU harness runs where TensorFlow is not installed.

* ``resnet50``: ResNet-50 v1.5's trainable variables (161 tensors, 25,557,032 elements), the
  set ``benchmarks/unscale_op.py`` measures on the CPU.
* ``bert_base``: BERT-base, uncased (199 tensors, 109,482,240 elements): embeddings, 12
  encoder layers of 16 tensors, pooler.
* ``transformer_1000``: a 1000-tensor model: a 62-layer, 512-wide encoder with a 32k
  vocabulary (212,358,656 elements), for lists longer than one launch can hold.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

Shape = Tuple[int, ...]


def resnet50_shapes() -> List[Shape]:
    """Conv kernels (HWIO), batch-norm gamma and beta, the final dense layer."""
    shapes: List[Shape] = [(7, 7, 3, 64), (64,), (64,)]
    in_channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            out_channels = 4 * width
            if block == 0:  # projection shortcut
                shapes += [(1, 1, in_channels, out_channels), (out_channels,), (out_channels,)]
            for kernel in ((1, 1, in_channels, width), (3, 3, width, width),
                           (1, 1, width, out_channels)):
                shapes += [kernel, (kernel[-1],), (kernel[-1],)]
            in_channels = out_channels
    return shapes + [(2048, 1000), (1000,)]


def _encoder_layer(width: int, hidden: int) -> List[Shape]:
    """Q, K, V, output projections with biases, two layer norms, the feed-forward pair."""
    attention = [(width, width), (width,)] * 4
    norm = [(width,), (width,)]
    feed_forward = [(width, hidden), (hidden,), (hidden, width), (width,)]
    return attention + norm + feed_forward + norm


def _encoder(vocab: int, positions: int, token_types: int, width: int, layers: int,
             final_norm: bool) -> List[Shape]:
    shapes: List[Shape] = [(vocab, width), (positions, width)]
    if token_types:
        shapes.append((token_types, width))
    shapes += [(width,), (width,)]  # embedding layer norm
    for _ in range(layers):
        shapes += _encoder_layer(width, 4 * width)
    if final_norm:
        shapes += [(width,), (width,)]
    return shapes + [(width, width), (width,)]  # pooler


def bert_base_shapes() -> List[Shape]:
    return _encoder(vocab=30522, positions=512, token_types=2, width=768, layers=12,
                    final_norm=False)


def transformer_1000_shapes() -> List[Shape]:
    return _encoder(vocab=32000, positions=512, token_types=0, width=512, layers=62,
                    final_norm=True)


MODELS = {
    "resnet50": resnet50_shapes,
    "bert_base": bert_base_shapes,
    "transformer_1000": transformer_1000_shapes,
}


def element_count(shape: Shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def model_sizes(name: str) -> List[int]:
    """Element counts of ``name``'s gradients, in variable order."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
    return [element_count(s) for s in MODELS[name]()]


def model_summary() -> Dict[str, Tuple[int, int]]:
    """{model: (tensors, elements)}."""
    return {name: (len(model_sizes(name)), sum(model_sizes(name))) for name in MODELS}
