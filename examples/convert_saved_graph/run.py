"""Convert a SavedModel and a frozen graph with ``tfamp-rewrite``, validate, and time them.

1. Builds a small image classifier (three convolutions and a dense layer, random weights)
   and exports it twice: as a SavedModel (tag ``serve``, signature ``serving_default``)
   and as a frozen GraphDef (``convert_variables_to_constants``).
2. Converts both with the command line, as ``tfamp-rewrite convert ... --validate`` would
   (the commands are printed; they run in this process to pay TensorFlow's import once),
   plus a bfloat16 conversion of the frozen graph for CPUs with bfloat16 instructions.
3. Loads every model with TensorFlow's own loaders, times fp32 against converted
   inference on the same batch (best of ``--runs``, interleaved) and prints agreement.

    python examples/convert_saved_graph/run.py [--out DIR] [--runs N] [--batch N]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfamp_rewrite.saved_graph.cli import main as tfamp_rewrite  # noqa: E402

tf1 = tf.compat.v1
SIZE, CLASSES = 32, 10


def build_classifier(images):
    """conv 3->32, conv 32->64 stride 2, conv 64->64, global mean, dense 64->10."""
    init = tf1.initializers.he_normal(seed=0)
    net = images
    for index, (channels, stride) in enumerate(((32, 1), (64, 2), (64, 1))):
        kernel = tf1.get_variable("conv%d/kernel" % index, [3, 3, net.shape[-1], channels], initializer=init)
        bias = tf1.get_variable("conv%d/bias" % index, [channels], initializer=tf1.zeros_initializer())
        net = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(net, kernel, stride, "SAME"), bias))
    net = tf.reduce_mean(net, [1, 2])
    kernel = tf1.get_variable("dense/kernel", [64, CLASSES],
                              initializer=tf1.initializers.glorot_uniform(seed=1))
    logits = tf.linalg.matmul(net, kernel, name="logits")
    return tf.nn.softmax(logits, name="probs")


def export(directory):
    """Writes ``saved_model/`` and ``frozen.pb`` into ``directory``; returns their paths."""
    saved_model, frozen = os.path.join(directory, "saved_model"), os.path.join(directory, "frozen.pb")
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as session:
        images = tf1.placeholder(tf.float32, [None, SIZE, SIZE, 3], name="images")
        probs = build_classifier(images)
        session.run(tf1.global_variables_initializer())
        builder = tf1.saved_model.Builder(saved_model)
        signature = tf1.saved_model.predict_signature_def({"images": images}, {"probs": probs})
        builder.add_meta_graph_and_variables(session, ["serve"],
                                             signature_def_map={"serving_default": signature})
        builder.save()
        graph_def = tf1.graph_util.convert_variables_to_constants(session, graph.as_graph_def(), ["probs"])
    with open(frozen, "wb") as handle:
        handle.write(graph_def.SerializeToString(deterministic=True))
    return saved_model, frozen


def convert(*args):
    print("\n$ tfamp-rewrite " + " ".join(args))
    status = tfamp_rewrite(list(args))
    if status != 0:
        sys.exit("tfamp-rewrite exited with status %d" % status)


class Model:
    """A loaded model: a session and the tensors to feed and fetch."""

    def __init__(self, path):
        self.graph = tf.Graph()
        self.session = tf1.Session(graph=self.graph)
        with self.graph.as_default():
            if os.path.isdir(path):
                meta = tf1.saved_model.loader.load(self.session, ["serve"], path)
                signature = meta.signature_def["serving_default"]
                self.feed, self.fetch = signature.inputs["images"].name, signature.outputs["probs"].name
            else:
                graph_def = tf1.GraphDef()
                with open(path, "rb") as handle:
                    graph_def.ParseFromString(handle.read())
                tf1.import_graph_def(graph_def, name="")
                self.feed, self.fetch = "images:0", "probs:0"

    def __call__(self, images):
        return self.session.run(self.fetch, {self.feed: images})


def size_of(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def compare(name, original_path, converted_path, images, runs):
    original, converted = Model(original_path), Model(converted_path)
    expected, actual = original(images), converted(images)  # also warms both up
    best = {original: float("inf"), converted: float("inf")}
    for _ in range(runs):
        for model in (original, converted):  # interleaved, so both see the same machine load
            start = time.perf_counter()
            model(images)
            best[model] = min(best[model], time.perf_counter() - start)
    top1 = float(np.mean(expected.argmax(-1) == actual.argmax(-1)))
    return (name, size_of(original_path), size_of(converted_path), 1e3 * best[original],
            1e3 * best[converted], top1, float(np.abs(expected - actual).max()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join("out", "convert_saved_graph"), help="working directory")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per model (best is kept)")
    parser.add_argument("--batch", type=int, default=64, help="images per inference")
    args = parser.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    saved_model, frozen = export(args.out)
    out = args.out
    convert("convert", saved_model, os.path.join(out, "saved_model_fp16"), "--validate",
            "--report", os.path.join(out, "saved_model_fp16.json"), "--quiet")
    convert("convert", frozen, os.path.join(out, "frozen_fp16.pb"), "--validate",
            "--report", os.path.join(out, "frozen_fp16.json"), "--quiet")
    convert("convert", frozen, os.path.join(out, "frozen_bf16.pb"), "--dtype", "bfloat16", "--target", "cpu",
            "--validate", "--quiet")
    convert("explain", frozen, "--node", "probs")
    images = np.random.default_rng(0).random([args.batch, SIZE, SIZE, 3], np.float32)
    pairs = [("SavedModel -> float16", saved_model, "saved_model_fp16"),
             ("frozen .pb -> float16", frozen, "frozen_fp16.pb"),
             ("frozen .pb -> bfloat16 (cpu)", frozen, "frozen_bf16.pb")]
    rows = [compare(name, source, os.path.join(out, converted), images, args.runs)
            for name, source, converted in pairs]
    print("\nInference on this machine's CPU, batch %d, best of %d runs:" % (args.batch, args.runs))
    header = ("model", "fp32 size", "new size", "fp32 ms", "new ms", "speed-up", "top-1 agree", "max abs err")
    print("%-30s %10s %10s %9s %9s %9s %12s %12s" % header)
    for name, size, new_size, fp32_ms, new_ms, top1, error in rows:
        print("%-30s %9.0fK %9.0fK %9.2f %9.2f %8.2fx %11.1f%% %12.2g" % (
            name, size / 1e3, new_size / 1e3, fp32_ms, new_ms, fp32_ms / new_ms, 100 * top1, error))
    print("A CPU has no Tensor Cores: float16 runs there through conversions, so it is not a speed "
          "measurement for GPUs; bfloat16 uses this CPU's bfloat16 instructions when it has them.")


if __name__ == "__main__":
    main()
