# syntax=docker/dockerfile:1
# flashcp-worker for GPU ranks (--device cuda:K): built on NVIDIA's CUDA 13.0 + cuDNN devel
# image (Ubuntu 24.04) with the README's scripts and FLASHCP_CUDA=ON, shipped on the matching
# cuDNN runtime image (CUDA runtime, cuDNN and NCCL), as a non-root user. The GPU driver
# (libcuda) comes from the node through the NVIDIA container runtime.
#
#   docker build -f docker/worker-cuda.Dockerfile -t flashcp/worker-cuda:dev .   # from the repo root
#   docker run --rm --gpus all --ipc=host -e FLASHCP_RANKS_PER_NODE=8 \
#     -e FLASHCP_PLANNER=planner:50051 flashcp/worker-cuda:dev --strategy flashcp --steps 100
ARG CUDA_TAG=13.0.1
ARG BUILD_IMAGE=nvidia/cuda:${CUDA_TAG}-cudnn-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:${CUDA_TAG}-cudnn-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
ARG JOBS=
# Ubuntu 24.04's GCC 13 is not the CI compiler (Debian 12's GCC 12): its new warnings must not
# break an image build. CI builds with warnings as errors.
ARG FLASHCP_WERROR=OFF
# 90 = Hopper (H100/H200).
ARG CUDA_ARCHITECTURES=90
WORKDIR /src
# install-deps.sh names Debian 12 packages; Ubuntu 24.04 (universe) carries the same names and
# the same gRPC 1.51 / protobuf 3.21 / abseil 20220623 series. NCCL's headers come from the
# CUDA apt repository that the NVIDIA image configures (the devel image usually has them).
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh \
 && (dpkg -s libnccl-dev >/dev/null 2>&1 || apt-get install -y -q --no-install-recommends libnccl-dev) \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN JOBS=${JOBS:-$(nproc)} FLASHCP_WERROR=${FLASHCP_WERROR} \
    bash scripts/build.sh -DFLASHCP_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}
RUN set -eu; mkdir -p /out/bin; \
    install -s build/bin/flashcp-worker /out/bin/; \
    install -m 0755 docker/flashcp-launch-ranks.sh /out/bin/flashcp-launch-ranks; \
    bash docker/runtime-packages.sh /out/bin/flashcp-worker > /out/runtime-packages.txt; \
    cat /out/runtime-packages.txt

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
# The runtime image already holds the CUDA runtime, cuDNN and NCCL; this adds the gRPC,
# protobuf, abseil, prometheus-cpp, Gloo and CBC runtime libraries.
RUN apt-get update -q \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y -q --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin flashcp
COPY --from=build /out/bin/ /usr/local/bin/
# libcuda.so.1 is mounted at run time by the NVIDIA container runtime; anything else missing fails.
RUN ! ldd /usr/local/bin/flashcp-worker | grep 'not found' | grep -v -e 'libcuda\.so' -e 'libnvidia-'
USER 10001:10001
ENV FLASHCP_DEVICE=cuda \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
EXPOSE 9470
ENTRYPOINT ["flashcp-launch-ranks"]
