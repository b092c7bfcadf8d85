"""ResNet-50 v1.5 training, benchmarking and evaluation with automatic mixed precision.

The flags are those of NVIDIA's TensorFlow ResNet-50 example, so its benchmark
commands work as they are::

    python examples/resnet50/main.py --mode=training_benchmark --warmup_steps 200 \\
        --num_iter 500 --iter_unit batch --batch_size 128 --use_tf_amp --use_xla

``--use_tf_amp`` wraps the optimizer with ``tfamp_rewrite.enable_mixed_precision_graph_rewrite``
(sessions then run the float16 rewrite, which needs a GPU of compute capability >= 7.0
unless ``TFAMP_REWRITE_TARGET=cpu``; add ``TFAMP_REWRITE_NUMERICS=emulate`` there to compute
as a Tensor Core GPU does, on float32 kernels).  Without ``--data_dir`` the data is synthetic.
On a CPU keep it small: ``--image_size 32 --width 8 --blocks 1,1,1,1 --batch_size 8``.
``main(argv)`` returns the results dict that ``results_<mode>.json`` holds.
"""
from __future__ import annotations

import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402
from resnet50 import data, model  # noqa: E402
from runtime import flags, runner  # noqa: E402

tf1 = tf.compat.v1


def parse_args(argv=None):
    parser = flags.common_parser(__doc__.splitlines()[0], batch_size=256, num_iter=90, warmup_steps=100,
                                 learning_rate=0.256)
    parser.add_argument("--data_dir", help="ImageNet TFRecords (train-*, validation-*); else synthetic data")
    parser.add_argument("--image_size", type=int, default=224, help="height and width of the input images")
    parser.add_argument("--num_classes", type=int, default=1001)
    parser.add_argument("--width", type=int, default=64, help="stem channels; the stages have 1x, 2x, 4x, 8x")
    parser.add_argument("--blocks", default="3,4,6,3", help="bottleneck blocks per stage")
    parser.add_argument("--momentum", type=float, default=0.875)
    parser.add_argument("--weight_decay", type=float, default=3.0517578125e-05)
    parser.add_argument("--label_smoothing", type=float, default=0.1)
    parser.add_argument("--lr_warmup_epochs", type=float, default=8,
                        help="linear learning-rate warm-up, then cosine decay (--lr_init is per 256 images)")
    args = parser.parse_args(argv)
    flags.check_args(parser, args)
    try:
        args.blocks = tuple(int(count) for count in args.blocks.split(","))
    except ValueError:
        parser.error("--blocks takes comma-separated block counts, e.g. 3,4,6,3 (got %r)" % args.blocks)
    if not args.blocks or min(args.blocks) < 1 or args.width < 1 or args.image_size < 8:
        parser.error("--blocks needs counts >= 1, --width >= 1 and --image_size >= 8")
    return args


class ResNet50Task(runner.Task):
    """ResNet-50 v1.5 on ImageNet-style data (see ``runtime.runner.Task``)."""

    name = "ResNet-50 v1.5"

    def __init__(self, args):
        self.args = args
        self.files = {training: data.record_files(args.data_dir, training) for training in (True, False)}

    def describe_data(self, training):
        files = self.files[training]
        if not files:
            return "synthetic %dx%d images" % (self.args.image_size, self.args.image_size)
        return "%d TFRecord file(s) in %s, %dx%d" % (len(files), self.args.data_dir,
                                                     self.args.image_size, self.args.image_size)

    def examples_per_epoch(self, training):
        return data.examples_per_epoch(self.files[training], training)

    def dataset(self, training, batch_size):
        if not self.files[training]:
            return data.synthetic_dataset(batch_size, self.args.image_size, self.args.num_classes)
        return data.tfrecord_dataset(self.files[training], batch_size, self.args.image_size, training,
                                     self.args.seed)

    def loss_and_metrics(self, features, labels, training):
        a = self.args
        logits = model.resnet_v15(features, a.num_classes, training, a.width, a.blocks)
        logits = tf.cast(logits, tf.float32)
        cross_entropy = tf1.losses.softmax_cross_entropy(
            tf.one_hot(labels, self.args.num_classes), logits, label_smoothing=self.args.label_smoothing)
        decayed = [tf.nn.l2_loss(v) for v in tf1.trainable_variables() if "batch_normalization" not in v.name]
        loss = tf.add(cross_entropy, self.args.weight_decay * tf.add_n(decayed), name="total_loss")
        metrics = {"top1_accuracy": _top_k(logits, labels, 1),
                   "top5_accuracy": _top_k(logits, labels, min(5, self.args.num_classes))}
        return loss, metrics

    def optimizer(self, args, global_step, total_steps):
        steps_per_epoch = math.ceil(self.examples_per_epoch(True) / args.batch_size)
        warmup = int(args.lr_warmup_epochs * steps_per_epoch)
        peak = args.lr_init * args.batch_size / 256.0
        learning_rate = warmup_cosine(peak, global_step, warmup, total_steps)
        return tf1.train.MomentumOptimizer(learning_rate, args.momentum), learning_rate


def _top_k(logits, labels, k):
    return tf.reduce_mean(tf.cast(tf1.nn.in_top_k(logits, labels, k), tf.float32))


def warmup_cosine(peak, global_step, warmup_steps, total_steps):
    """Linear warm-up to ``peak`` over ``warmup_steps``, then cosine decay to 0 at ``total_steps``."""
    step = tf.cast(global_step, tf.float32)
    warming = peak * (step + 1.0) / max(1, warmup_steps)
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    decaying = 0.5 * peak * (1.0 + tf.cos(math.pi * tf.minimum(progress, 1.0)))
    return tf.where(step < warmup_steps, warming, decaying)


def main(argv=None):
    args = parse_args(argv)
    return runner.run(ResNet50Task(args), args)


if __name__ == "__main__":
    main()
