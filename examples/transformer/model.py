"""A BERT-style Transformer encoder in TF1 graph mode (``tf.compat.v1`` only).

    embeddings: token + learned position embeddings, layer norm, dropout
    layers x N: x = LayerNorm(x + Dropout(MultiHeadSelfAttention(x)))
                x = LayerNorm(x + Dropout(Dense(GELU(Dense(x)))))
    head:       dense + GELU + layer norm, then logits against the (tied) token embeddings

Attention scores are ``Q K^T / sqrt(d)`` through ``BatchMatMulV2``, the ops that AMP runs
in float16; softmax and the layer-norm statistics are what it keeps in float32.
"""
from __future__ import annotations

import math

import tensorflow as tf

tf1 = tf.compat.v1


def gelu(x):
    """GELU, tanh approximation (as BERT); written out, as ``tf.nn.gelu`` is not in TF 1.15."""
    return 0.5 * x * (1.0 + tf.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def layer_norm(x, name, epsilon=1e-6):
    """Layer normalisation over the last axis, with learned scale and offset."""
    with tf1.variable_scope(name):
        size = x.shape[-1]
        gamma = tf1.get_variable("gamma", [size], initializer=tf1.ones_initializer())
        beta = tf1.get_variable("beta", [size], initializer=tf1.zeros_initializer())
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + epsilon) * gamma + beta


def _dense(x, units, name, activation=None):
    return tf1.layers.dense(x, units, activation=activation, name=name,
                            kernel_initializer=tf1.truncated_normal_initializer(stddev=0.02))


def _heads(x, batch, seq_len, num_heads, head_size):
    """``[batch, seq_len, hidden]`` -> ``[batch, heads, seq_len, head_size]``."""
    return tf.transpose(tf.reshape(x, [batch, seq_len, num_heads, head_size]), [0, 2, 1, 3])


def self_attention(x, num_heads, dropout, training, name):
    with tf1.variable_scope(name):
        batch, seq_len, hidden = x.shape.as_list()
        head_size = hidden // num_heads
        q, k, v = (_heads(_dense(x, hidden, part), batch, seq_len, num_heads, head_size)
                   for part in ("query", "key", "value"))
        scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(head_size))
        probs = tf1.layers.dropout(tf.nn.softmax(scores), dropout, training=training)
        context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [batch, seq_len, hidden])
        return _dense(context, hidden, "output")


def encoder(input_ids, vocab_size, hidden, num_layers, num_heads, ffn_size, dropout, training):
    """Logits ``[batch, seq_len, vocab_size]`` for int32 ``input_ids`` ``[batch, seq_len]``."""
    if hidden % num_heads:
        raise ValueError("hidden size %d is not a multiple of %d heads" % (hidden, num_heads))
    seq_len = input_ids.shape[1]
    with tf1.variable_scope("encoder"):
        embeddings = tf1.get_variable("token_embeddings", [vocab_size, hidden],
                                      initializer=tf1.truncated_normal_initializer(stddev=0.02))
        positions = tf1.get_variable("position_embeddings", [seq_len, hidden],
                                     initializer=tf1.truncated_normal_initializer(stddev=0.02))
        x = tf.gather(embeddings, input_ids) + positions
        x = tf1.layers.dropout(layer_norm(x, "embeddings_norm"), dropout, training=training)
        for layer in range(num_layers):
            with tf1.variable_scope("layer%d" % layer):
                attention = self_attention(x, num_heads, dropout, training, "attention")
                attention = tf1.layers.dropout(attention, dropout, training=training)
                x = layer_norm(x + attention, "attention_norm")
                inner = _dense(x, ffn_size, "intermediate", activation=gelu)
                out = tf1.layers.dropout(_dense(inner, hidden, "ffn_output"), dropout, training=training)
                x = layer_norm(x + out, "ffn_norm")
        x = layer_norm(_dense(x, hidden, "head_transform", activation=gelu), "head_norm")
        bias = tf1.get_variable("output_bias", [vocab_size], initializer=tf1.zeros_initializer())
        return tf.matmul(x, tf.cast(embeddings, x.dtype), transpose_b=True) + bias
