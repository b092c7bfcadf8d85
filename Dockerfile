# tfamp_rewrite on NVIDIA's TensorFlow 1.15 container (Python 3.8, CUDA, Horovod).
#   docker build -t tfamp_rewrite .
#   docker run --gpus all --rm tfamp_rewrite python examples/demo.py
FROM nvcr.io/nvidia/tensorflow:23.03-tf1-py3

WORKDIR /opt/tfamp_rewrite
COPY . .
# TensorFlow comes from the image (nvidia-tensorflow 1.15); install only the package.
RUN python -m pip install --no-cache-dir . \
 && python -c "import tfamp_rewrite, tensorflow as tf; print('tfamp_rewrite on TensorFlow', tf.__version__)"
