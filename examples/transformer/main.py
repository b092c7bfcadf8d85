"""A BERT-style Transformer encoder trained on a synthetic masked-token task, with AMP.

Same flags and output as ``examples/resnet50/main.py``::

    python examples/transformer/main.py --mode=training_benchmark --warmup_steps 20 \\
        --num_iter 200 --batch_size 64 --use_tf_amp --use_xla

The task (``transformer/data.py``) needs no download: masked positions of arithmetic
token sequences.  ``--use_tf_amp`` goes through
``tfamp_rewrite.enable_mixed_precision_graph_rewrite``; on a machine without a Tensor
Core GPU set ``TFAMP_REWRITE_TARGET=cpu`` (and ``TFAMP_REWRITE_NUMERICS=emulate`` for a Tensor
Core GPU's numerics on float32 kernels).  ``main(argv)`` returns the results dict.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402
from runtime import flags, runner  # noqa: E402
from transformer import data, model  # noqa: E402

tf1 = tf.compat.v1


def parse_args(argv=None):
    parser = flags.common_parser(__doc__.splitlines()[0], batch_size=64, num_iter=500, warmup_steps=20,
                                 learning_rate=2e-3)
    parser.add_argument("--seq_len", type=int, default=32)
    parser.add_argument("--vocab_size", type=int, default=64)
    parser.add_argument("--hidden_size", type=int, default=128)
    parser.add_argument("--num_layers", type=int, default=2)
    parser.add_argument("--num_heads", type=int, default=4)
    parser.add_argument("--ffn_size", type=int, default=512)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--num_examples", type=int, default=8192, help="training examples (an epoch)")
    parser.add_argument("--lr_warmup_steps", type=int, default=50,
                        help="linear learning-rate warm-up, then linear decay to 0")
    args = parser.parse_args(argv)
    flags.check_args(parser, args)
    if args.hidden_size % args.num_heads:
        parser.error("--hidden_size must be a multiple of --num_heads")
    if args.seq_len < 4 or args.vocab_size < 4:
        parser.error("--seq_len and --vocab_size must be >= 4")
    return args


class TransformerTask(runner.Task):
    """The encoder on the masked-token task (see ``runtime.runner.Task``)."""

    name = "Transformer encoder"
    rate_key = "seq_per_sec"
    unit = "sequences/s"

    def __init__(self, args):
        self.args = args

    def describe_data(self, training):
        return "synthetic masked-token task, %d sequences of %d tokens" % (
            self.examples_per_epoch(training), self.args.seq_len)

    def examples_per_epoch(self, training):
        return self.args.num_examples if training else max(self.args.batch_size, self.args.num_examples // 4)

    def dataset(self, training, batch_size):
        return data.dataset(self.examples_per_epoch(training), self.args.seq_len, self.args.vocab_size,
                            self.args.seed, batch_size, training)

    def loss_and_metrics(self, features, labels, training):
        a = self.args
        input_ids = tf.ensure_shape(features["input_ids"], [a.batch_size, a.seq_len])
        logits = model.encoder(input_ids, a.vocab_size, a.hidden_size, a.num_layers, a.num_heads,
                               a.ffn_size, a.dropout, training)
        logits = tf.cast(logits, tf.float32)
        weights = labels["mask_weights"]
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels["target_ids"], logits=logits)
        loss = tf.identity(tf.reduce_sum(losses * weights) / tf.reduce_sum(weights), name="masked_lm_loss")
        correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels["target_ids"]),
                          tf.float32)
        accuracy = tf.reduce_sum(correct * weights) / tf.reduce_sum(weights)
        return loss, {"masked_accuracy": accuracy}

    def optimizer(self, args, global_step, total_steps):
        step = tf.cast(global_step, tf.float32)
        warmup = float(max(1, args.lr_warmup_steps))
        decay = tf.maximum(0.0, (total_steps - step) / max(1.0, total_steps - warmup))
        learning_rate = args.lr_init * tf.minimum((step + 1.0) / warmup, decay)
        return tf1.train.AdamOptimizer(learning_rate), learning_rate


def main(argv=None):
    args = parse_args(argv)
    return runner.run(TransformerTask(args), args)


if __name__ == "__main__":
    main()
