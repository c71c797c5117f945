# The recipe on top of NVIDIA's MXNet container, which already has MXNet (with NVIDIA's fused kernels), Horovod
# with NCCL, and CUDA; its DALI is replaced by the one the recipe is tested with (requirements-container.txt).
# Build and run:
#   docker build . -t nvidia_rn50_mx [--build-arg FROM_IMAGE_NAME=nvcr.io/nvidia/mxnet:<tag>]
#   nvidia-docker run --rm -it --ipc=host -v <dataset>:/data/imagenet/train-val-recordio-passthrough nvidia_rn50_mx
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/mxnet:22.10-py3
FROM ${FROM_IMAGE_NAME}

WORKDIR /workspace/rn50
# What the recipe imports that the container lacks, pinned for the 22.10 container's Python 3.8 (the files say why).
# The container's own numpy and protobuf, which its MXNet and ONNX tools were built against, become constraints:
# the install fits around them or fails the build, and never replaces them.
COPY requirements-container.txt requirements-container-nodeps.txt ./
RUN python -c "import importlib.metadata as m; print(*[f'{d.metadata[\"Name\"]}=={d.version}' for d in \
        m.distributions() if (d.metadata['Name'] or '').lower() in ('numpy', 'protobuf')], sep='\n')" > /tmp/container.txt && \
    cat /tmp/container.txt && \
    pip install --no-cache-dir -c /tmp/container.txt -r requirements-container.txt && \
    pip install --no-cache-dir --no-deps -r requirements-container-nodeps.txt && \
    python -c "import tqdm, safetensors.numpy, PIL, psutil, sklearn, matplotlib, onnx, onnxruntime, tensorboardX"
COPY . .
# The Horovod API the recipe calls (workers.HOROVOD_API): a container whose Horovod lacks part of it fails here.
RUN python -c "import horovod, horovod.mxnet as hvd; from rn50.world import workers; workers.check_horovod_api(hvd); print('Horovod', horovod.__version__)"
# The DALI the recipe is tested with (requirements-container.txt replaces the base image's older one): one without
# automatic augmentation (nvidia.dali.auto_aug, pipelines with conditionals) fails here, as --auto-augment would.
RUN python -c "import nvidia.dali, nvidia.dali.auto_aug; from rn50.data import augment; augment.check_dali(); print('DALI', nvidia.dali.__version__)"
ENV MXNET_CUDNN_AUTOTUNE_DEFAULT=0
