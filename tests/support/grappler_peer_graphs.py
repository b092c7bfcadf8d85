"""The graphs of TensorFlow's ``python/grappler/auto_mixed_precision_test.py``.

Built as TensorFlow 1.15 built them: ``tf.compat.v1`` graph mode, reference variables and
control flow v1.  ``tf1_graph_mode()`` switches both (the test module holds it as a
fixture) and the builders refuse to run outside it.  Each builder returns a
``PeerGraph``: the GraphDef, the tensors the Python test fetches, and ``init`` (the
variable initializer to run first).

The layers are the test file's own helpers (``_conv_bn``, ``_conv_pool``, ``_matmul_act``,
``_lstm_cell``, the coloured simple loop), with the same names and seeds, so the node
names its expectations use (``Conv2D_1``, ``while/MatMul``...) are the names here too.
"""
from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Callable, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import function

tf1 = tf.compat.v1


@dataclass
class PeerGraph:
    graph_def: object
    fetches: Tuple[str, ...]   # tensor names
    init: str = "init"

    @property
    def fetch_nodes(self) -> Tuple[str, ...]:
        return tuple(dict.fromkeys(name.split(":")[0] for name in self.fetches))


@contextlib.contextmanager
def tf1_graph_mode():
    """Control flow v1 and reference variables, as in TF 1.15; restores the previous state."""
    saved = tf1.control_flow_v2_enabled(), tf1.resource_variables_enabled()
    tf1.disable_control_flow_v2()
    tf1.disable_resource_variables()
    try:
        yield
    finally:
        if saved[0]:
            tf1.enable_control_flow_v2()
        if saved[1]:
            tf1.enable_resource_variables()


def _build(body: Callable[[], Sequence[object]], seed: int = 0) -> PeerGraph:
    """Runs ``body`` in a fresh graph; it returns the tensors (or nested lists) to fetch."""
    if tf1.control_flow_v2_enabled() or tf1.resource_variables_enabled():
        raise RuntimeError("build the TF 1.15 test graphs inside tf1_graph_mode(): control "
                           "flow v1 and reference variables")
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        random.seed(seed)  # Keras-backed tf1.layers draw their initializers' seeds from it
        outputs = body()
        tf1.global_variables_initializer()   # named "init"
    fetches = tuple(t.name for t in tf.nest.flatten(outputs) if isinstance(t, tf.Tensor))
    return PeerGraph(graph.as_graph_def(), fetches)


def _gradients(y, xs):
    """The gradients ``GradientDescentOptimizer.compute_gradients`` returns (not the vars)."""
    optimizer = tf1.train.GradientDescentOptimizer(learning_rate=0.01)
    return [grad for grad, _ in optimizer.compute_gradients(y, xs)]


# --- the test file's layers --------------------------------------------------------------

def _input(shape):
    return tf1.Variable(tf1.truncated_normal(shape, seed=0))


def _weight(shape):
    # The lambda lets the variable be created inside a loop body.
    return tf1.Variable(lambda: tf1.glorot_uniform_initializer(seed=0)(shape))


def _bias(shape):
    return tf.constant(0.1, shape=shape)


def _conv2d(x, w):
    return tf1.nn.conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME")


def _max_pool_2x2(x):
    return tf1.nn.max_pool(x, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="SAME")


def _conv_bn(x):
    x = _conv2d(tf.reshape(x, [-1, 8, 8, 1]), _weight([3, 3, 1, 6]))
    y, _, _ = tf1.nn.fused_batch_norm(x, scale=_weight([6]), offset=_weight([6]), is_training=True)
    return tf.identity(y)


def _matmul_act(x):
    return tf.nn.relu(tf.matmul(tf.reshape(x, [8, 8]), _weight([8, 8])))


def _conv_pool(x):
    """(Conv -> bias -> relu -> max_pool) x2."""
    x_image = tf.reshape(x, [-1, 8, 8, 1])
    h_conv1 = tf.nn.relu(tf.nn.bias_add(_conv2d(x_image, _weight([3, 3, 1, 6])), _bias([6])))
    h_pool1 = _max_pool_2x2(h_conv1)
    h_conv2 = tf.nn.relu(tf.nn.bias_add(_conv2d(h_pool1, _weight([3, 3, 6, 4])), _bias([4])))
    return _max_pool_2x2(h_conv2)


def _simple_loop(x, functor):
    return tf1.while_loop(lambda i, j: i < 4, lambda i, j: (i + 1, functor(j)),
                          (tf.constant(0), x))


def _lstm_cell(prev_c, prev_h, x):
    bias = _bias([4])
    ifoc = tf.matmul(tf.concat([x, prev_h], axis=1), _weight([8, 16]))
    i, f, o, c = tf.split(ifoc, 4, axis=1)
    i = tf.sigmoid(tf.nn.bias_add(i, bias))
    f = tf.sigmoid(tf.nn.bias_add(f, bias))
    o = tf.sigmoid(tf.nn.bias_add(o, bias))
    c = tf.tanh(tf.nn.bias_add(c, bias))
    next_c = f * prev_c + i * c
    return next_c, o * tf.tanh(next_c)


def _make_node_with_color(color, x, name):
    """w MatMul (allow), g Add (infer), c Relu (clear), b Sqrt(Pow) (deny then infer)."""
    color = color.lower()
    if color == "w":
        return tf.matmul(x, _weight(x.get_shape().as_list()), name=name)
    if color == "g":
        return tf.add(x, 0.1, name=name)
    if color == "c":
        return tf.nn.relu(x, name=name)
    if color == "b":
        return tf.sqrt(tf.pow(x, 2.0), name=name)
    raise ValueError("invalid node color %r" % color)


# --- the tests' graphs -------------------------------------------------------------------

def conv_bn() -> PeerGraph:
    return _build(lambda: _conv_bn(_conv_bn(_input([2, 8, 8, 1]))))


def conv_bn_dropout() -> PeerGraph:
    def body():
        x = _input([2, 8, 8, 1])
        y = tf1.nn.dropout(_conv_bn(x), rate=0.5)
        y = tf.identity(_conv_bn(tf.add(y, 1, name="addition")))
        return y, _gradients(y, [x])
    return _build(body)


def conv_pool() -> PeerGraph:
    return _build(lambda: _conv_pool(_input([2, 8, 8, 1])))


def simple_loop() -> PeerGraph:
    def body():
        x = _input([8, 8])
        y = _simple_loop(x, _matmul_act)[1]
        return y, _gradients(y, [x])
    return _build(body)


def loop_with_vars_intertwined() -> PeerGraph:
    def body():
        x = _input([8, 8])
        init = (tf.constant(0), tf.constant(0), tf.ones(tf.shape(x)), x)
        _, _, first, second = tf1.while_loop(
            lambda i, j, x, y: j < 4,
            lambda i, j, x, y: (j + 1, i + 1, _matmul_act(y), _matmul_act(x)), init)
        return first, second, _gradients(first, [x])
    return _build(body)


def multi_paths() -> PeerGraph:
    def body():
        x = _input([2, 8, 8, 3])
        x1, x2, x3 = tf.split(x, num_or_size_splits=3, axis=3)
        y = tf.identity(tf.concat([_conv_pool(x1), _conv_pool(x2), _conv_pool(x3)], axis=3))
        return y, _gradients(y, [x])
    return _build(body)


def multi_paths_2() -> PeerGraph:
    def body():
        x = _input([8, 8])
        y = _matmul_act(x) + _matmul_act(x) + x
        return _gradients(y, [x]), y
    return _build(body)


def recurrent_lstm() -> PeerGraph:
    """Dynamic single-layer LSTM reading its inputs from a TensorArray."""
    def body():
        init_c, init_h = _input([8, 4]), _input([8, 4])
        ta_x = tf1.TensorArray(dtype=tf.float32, size=4)
        for i in range(4):
            ta_x = ta_x.write(i, tf.constant(0.1, shape=[8, 4], dtype=tf.float32))

        def loop_body(i, c, h, ta_x):
            next_c, next_h = _lstm_cell(c, h, ta_x.read(i))
            return i + 1, next_c, next_h, ta_x

        _, _, h, _ = tf1.while_loop(lambda i, c, h, ta_x: i < 4, loop_body,
                                    (tf.constant(0), init_c, init_h, ta_x))
        return h, _gradients(h, [init_c, init_h])
    return _build(body)


def simple_loop_colors(inp: str, body_colors: str, out: str) -> PeerGraph:
    """input nodes ``input_<i>`` -> while loop with body nodes ``while/body_<i>`` -> output
    nodes ``output_<i>`` -> Identity; the letters give each node's colour."""
    def body():
        a = _input([8, 8])
        for i, color in enumerate(inp):
            a = _make_node_with_color(color, a, "input_%i" % i)

        def loop_body(x):
            for i, color in enumerate(body_colors):
                x = _make_node_with_color(color, x, "body_%i" % i)
            return x

        _, a = _simple_loop(a, loop_body)
        for i, color in enumerate(out):
            a = _make_node_with_color(color, a, "output_%i" % i)
        return tf.identity(a)
    return _build(body)


def _swish_grad_shape(op):
    return [op.inputs[0].shape]


@function.Defun(shape_func=_swish_grad_shape, func_name="example_noninlined_funcdef_grad",
                noinline=True)
def _swish_grad(features, grad):
    sigmoid_features = tf.sigmoid(features)
    return grad * (sigmoid_features * (1.0 + features * (1.0 - sigmoid_features)))


@function.Defun(grad_func=_swish_grad, shape_func=_swish_grad_shape,
                func_name="example_noninlined_funcdef", noinline=True)
def _swish(features):
    return features * tf.sigmoid(features)


def noninlined_funcdef() -> PeerGraph:
    """MatMul -> Relu -> a non-inlined Swish function (op type only in the library)."""
    def body():
        x = _input([8, 8])
        y = _swish(_matmul_act(x))
        return _gradients(y, [x]), y
    return _build(body)


def ingraph_train_loop(num_iter=3, batch=64, channels=32, classes=100) -> PeerGraph:
    """A while loop around a Dense layer's Adam training step, fed by a dataset iterator.

    ``num_iter`` is 3 instead of 100: the loop structure is what matters."""
    rng = np.random.RandomState(1234)
    data = rng.normal(size=(batch * num_iter, channels)).astype(np.float32)
    labels = rng.randint(classes, size=(batch * num_iter,))

    def body():
        dataset = tf1.data.Dataset.from_tensor_slices((data, labels)).batch(batch)
        iterator = tf1.data.make_one_shot_iterator(dataset)

        def loop_body(_, i):
            x, yt = iterator.get_next()
            dense = tf1.layers.Dense(classes)
            loss = tf1.losses.sparse_softmax_cross_entropy(yt, dense(x))
            train_op = tf1.train.AdamOptimizer().minimize(loss, var_list=dense.trainable_weights)
            with tf.control_dependencies([train_op]):
                loss = tf.identity(loss)
            return loss, i + 1

        loss, _ = tf1.while_loop(lambda loss, i: tf.less(i, num_iter), loop_body,
                                 [0.0, tf.constant(0)])
        return loss
    return _build(body, seed=1234)
