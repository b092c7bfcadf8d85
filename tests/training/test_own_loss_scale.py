"""own_loss_scale.own_scale: which products are the program's own loss scale."""
import numpy as np
import tensorflow as tf

from tfamp_rewrite.training.own_loss_scale import own_scale

tf1 = tf.compat.v1


def test_a_constant_or_a_non_trainable_variable_factor_is_the_programs_scale():
    graph = tf.Graph()
    with graph.as_default():
        loss = tf.reduce_sum(tf1.placeholder(tf.float32, [4]))
        hand_scale = tf1.Variable(128.0, trainable=False, name="hand_scale")
        weight = tf1.Variable(3.0, name="weight")
        assert own_scale(loss * 1024.0) == "1024"
        assert own_scale(tf.cast(hand_scale, tf.float32) * loss) == "the variable 'hand_scale'"
        assert own_scale(loss * tf.constant(np.float32(0.5))) is None   # a mean, not a scale
        assert own_scale(loss * weight) is None                           # a trainable weight
        assert own_scale(loss + 1024.0) is None
        objects = tf1.Variable(32768.0, trainable=False, name="loss_scale/current_loss_scale")
        assert own_scale(loss * objects) is None                          # a loss-scale object's
        assert own_scale(loss) is None
