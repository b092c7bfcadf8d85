"""tf.keras in TF1 graph mode, compiled with a ``tf.compat.v1.train`` optimizer.

A ``Sequential`` classifier (two ReLU ``Dense`` layers, dropout, softmax) compiled with
``tf.compat.v1.train.AdamOptimizer`` -- the TF 1.x way to give Keras a TensorFlow optimizer --
and trained with ``fit``, then scored with ``evaluate`` and ``predict``.  Keras runs through
its own session and ``Session._make_callable_from_options``, initialises the optimizer's
variables itself and builds its predict function after training.  The data is made here:
four Gaussian clusters in 24 dimensions whose means overlap, with 10% of the labels redrawn.
"""
import argparse
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

DATA_SEED = 4321  # the data set is fixed: --seed varies the initial weights and the batches


def make_data(seed, per_class=400, classes=4, features=24):
    rng = np.random.RandomState(seed)
    means = rng.normal(0.0, 0.6, (classes, features))
    inputs = np.concatenate([rng.normal(mean, 1.0, (per_class, features)) for mean in means])
    labels = np.repeat(np.arange(classes), per_class)
    noisy = rng.uniform(size=len(labels)) < 0.10  # label noise: the loss has a floor well above 0
    labels[noisy] = rng.randint(0, classes, noisy.sum())
    order = rng.permutation(len(labels))
    return inputs[order].astype(np.float32), labels[order].astype(np.int32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=8, help="epochs")
    args = parser.parse_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    tf1.set_random_seed(args.seed)
    inputs, labels = make_data(DATA_SEED)

    model = tf.keras.Sequential([
        tf.keras.layers.Dense(96, activation="relu", input_shape=(inputs.shape[1],)),
        tf.keras.layers.Dropout(0.1),
        tf.keras.layers.Dense(96, activation="relu"),
        tf.keras.layers.Dense(4, activation="softmax"),
    ])
    model.compile(optimizer=tf1.train.AdamOptimizer(0.002), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    report = tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: print(
        "step %d loss %.4f accuracy %.3f" % (epoch, logs["loss"], logs.get("acc", logs.get("accuracy")))))
    model.fit(inputs, labels, batch_size=64, epochs=args.steps, shuffle=True, verbose=0,
              callbacks=[report])
    loss, accuracy = model.evaluate(inputs, labels, batch_size=256, verbose=0)
    predicted = np.argmax(model.predict(inputs[:256], batch_size=256), axis=1)
    print("evaluate accuracy %.3f, predict accuracy on 256 %.3f"
          % (accuracy, np.mean(predicted == labels[:256])))
    print("final loss: %.6f" % loss)


if __name__ == "__main__":
    main()
