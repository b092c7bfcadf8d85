# tfamp_rewrite on NVIDIA's TensorFlow 1.15 container (Python 3.8, CUDA 12, Horovod).
#   docker build -t tfamp_rewrite .
#   docker run --gpus all --rm tfamp_rewrite python examples/train_tf1/train.py --amp
#   docker run --gpus all --rm -e TF_ENABLE_AUTO_MIXED_PRECISION=1 tfamp_rewrite python examples/train_tf1/train.py
FROM nvcr.io/nvidia/tensorflow:23.03-tf1-py3

WORKDIR /opt/tfamp_rewrite
COPY . .
# TensorFlow comes from the image (nvidia-tensorflow 1.15); install only the package, with the
# scikit-learn the example reads its data from.
RUN python -m pip install --no-cache-dir . scikit-learn
# Build the fused op against the image's TensorFlow with its CUDA 12 nvcc, for V100 (sm_70)
# to H100 (sm_90); without it the package falls back to composite TF ops and says so.
RUN TFAMP_CUDA_ARCHS=70,75,80,86,90 python -m tfamp_rewrite.fused_op.build \
 && python -c "import tfamp_rewrite, tensorflow as tf; print('tfamp_rewrite', tfamp_rewrite.__version__, \
'on TensorFlow', tf.__version__, '- fused op:', tfamp_rewrite.fused_op_available())"
# NVIDIA's own AMP reacts to TF_ENABLE_AUTO_MIXED_PRECISION too: tfamp_rewrite's sessions turn
# TensorFlow's Grappler AMP off, and optimizers that already scale their loss natively are left to it.
