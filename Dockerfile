# The recipe on top of NVIDIA's MXNet container, which already has MXNet (with NVIDIA's fused kernels), Horovod
# with NCCL, and CUDA; its DALI is replaced by the one the recipe is tested with (requirements-container.txt).
# Build and run:
#   docker build . -t nvidia_rn50_mx [--build-arg FROM_IMAGE_NAME=nvcr.io/nvidia/mxnet:<tag>]
#   docker run --gpus all --rm -it --ipc=host -v <dataset>:/data/imagenet/train-val-recordio-passthrough nvidia_rn50_mx
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/mxnet:22.10-py3
FROM ${FROM_IMAGE_NAME}

WORKDIR /workspace/rn50
# What the recipe imports that the container lacks, pinned for the 22.10 container's Python 3.8 (the files say why).
# The image's own numpy, which its MXNet was built against, is a constraint (never replaced); its protobuf too when
# it is 3.20.2 or newer, else pip raises it within 3.x (scripts/container_setup.py says why).
COPY requirements-container.txt requirements-container-nodeps.txt ./
COPY scripts/container_setup.py scripts/bootstrap.py scripts/
RUN python scripts/container_setup.py constraints > /tmp/container.txt && cat /tmp/container.txt && \
    pip install --no-cache-dir -c /tmp/container.txt -r requirements-container.txt && \
    pip install --no-cache-dir --no-deps -r requirements-container-nodeps.txt
COPY . .
# Everything the recipe imports loads: the packages above, the DALI with automatic augmentation
# (nvidia.dali.auto_aug, conditional pipelines) that --auto-augment needs, and the Horovod API the workers call
# (workers.HOROVOD_API). A docker build has no CUDA driver, which NVIDIA's MXNet links: the check loads MXNet
# with CUDA's stub library (container_setup.py); the workers check Horovod's API again at start, on the GPUs. It loads
# MXNet as the workers do, leaving its operators compiled in ~/.cache/rn50 (rn50/world/operator_cache.py).
RUN python scripts/container_setup.py check
ENV MXNET_CUDNN_AUTOTUNE_DEFAULT=0
