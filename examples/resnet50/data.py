"""Input pipelines for the ResNet-50 example: ImageNet TFRecords or synthetic images.

TFRecords are read as NVIDIA's and TensorFlow's ImageNet scripts write them: files
``train-*`` and ``validation-*`` in ``--data_dir``, each record holding a JPEG in
``image/encoded`` and an int64 ``image/class/label``.  Images are decoded, augmented
(training: random crop of at least 35% of the area and a random flip; evaluation: a
central crop of 87.5%), resized to ``image_size`` and normalised per channel.

Synthetic data (no ``--data_dir``) is one random batch generated when the iterator is
initialised and repeated, so the input costs nothing and the benchmark measures the
model alone.
"""
from __future__ import annotations

import glob
import os
from typing import List, Optional

import tensorflow as tf

tf1 = tf.compat.v1
IMAGENET_EXAMPLES = {True: 1281167, False: 50000}
CHANNEL_MEANS = (123.68, 116.78, 103.94)
CHANNEL_STDS = (58.40, 57.12, 57.38)
# Counting records reads every file; above this size the ImageNet counts are assumed.
_COUNT_LIMIT_BYTES = 1 << 30


def record_files(data_dir: Optional[str], training: bool) -> List[str]:
    """The TFRecord files of one split (empty without ``data_dir``)."""
    if not data_dir:
        return []
    pattern = os.path.join(data_dir, "train-*" if training else "validation-*")
    files = sorted(glob.glob(pattern))
    if not files:
        raise SystemExit("--data_dir %s has no files matching %s" % (data_dir, os.path.basename(pattern)))
    return files


def examples_per_epoch(files: List[str], training: bool) -> int:
    """Records in ``files``; ImageNet's split size for synthetic data or very large files."""
    if not files or sum(os.path.getsize(f) for f in files) > _COUNT_LIMIT_BYTES:
        return IMAGENET_EXAMPLES[training]
    return sum(1 for f in files for _ in tf1.io.tf_record_iterator(f))


def synthetic_dataset(batch_size: int, image_size: int, num_classes: int) -> tf.data.Dataset:
    images = tf1.random.truncated_normal([batch_size, image_size, image_size, 3], name="synthetic_images")
    labels = tf1.random.uniform([batch_size], 0, num_classes, dtype=tf.int32, name="synthetic_labels")
    return tf.data.Dataset.from_tensors((images, labels)).repeat()


def _parse(record, image_size: int, training: bool):
    features = tf1.parse_single_example(record, {
        "image/encoded": tf1.FixedLenFeature([], tf.string),
        "image/class/label": tf1.FixedLenFeature([], tf.int64),
    })
    image = tf.image.decode_jpeg(features["image/encoded"], channels=3)
    if training:
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.shape(image), tf.zeros([0, 0, 4]), min_object_covered=0.1,
            aspect_ratio_range=(0.75, 1.33), area_range=(0.35, 1.0), use_image_if_no_bounding_boxes=True)
        image = tf.image.random_flip_left_right(tf.slice(image, begin, size))
    else:
        image = tf.image.central_crop(image, 0.875)
    image = tf1.image.resize_images(tf.cast(image, tf.float32), [image_size, image_size])
    image = (image - tf.constant(CHANNEL_MEANS)) / tf.constant(CHANNEL_STDS)
    return image, tf.cast(features["image/class/label"], tf.int32)


def tfrecord_dataset(files: List[str], batch_size: int, image_size: int, training: bool,
                     seed: int) -> tf.data.Dataset:
    dataset = tf.data.TFRecordDataset(files)
    if training:
        dataset = dataset.shuffle(1024, seed=seed)
    dataset = dataset.repeat().map(lambda record: _parse(record, image_size, training),
                                   num_parallel_calls=4)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(2)
