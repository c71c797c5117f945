# The recipe on top of NVIDIA's MXNet container, which already has MXNet (with NVIDIA's fused kernels), DALI,
# Horovod with NCCL, and CUDA. Build and run:
#   docker build . -t nvidia_rn50_mx [--build-arg FROM_IMAGE_NAME=nvcr.io/nvidia/mxnet:<tag>]
#   nvidia-docker run --rm -it --ipc=host -v <dataset>:/data/imagenet/train-val-recordio-passthrough nvidia_rn50_mx
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/mxnet:22.10-py3
FROM ${FROM_IMAGE_NAME}

WORKDIR /workspace/rn50
# What the container lacks: image tools for dataset preparation, plots for benchmark.py, ONNX for export. No version pins:
# the container's own Python and numpy decide which releases fit (requirements.txt pins the CPU set-up).
RUN pip install --no-cache-dir Pillow scikit-learn matplotlib psutil onnx onnxruntime
COPY . .
ENV MXNET_CUDNN_AUTOTUNE_DEFAULT=0
