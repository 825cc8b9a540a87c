# syntax=docker/dockerfile:1
# flashcp-worker for GPU ranks (--device cuda:K), on Debian 12 like the other images: CUDA 13.0,
# cuDNN 9 and NCCL come from NVIDIA's pinned PyPI wheels (docker/cuda-wheels.sh), the compiler
# (nvcc) for the build stage, the shared libraries for the runtime stage. No NVIDIA registry or
# apt repository is needed. The GPU driver (libcuda) comes from the node through the NVIDIA
# container runtime; the host needs driver branch R580 or newer (CUDA 13.x, docker/README.md).
# The image also carries the GPU test binaries (ctest label gpu), a node's self-test.
#
#   docker build -f docker/worker-cuda.Dockerfile -t flashcp/worker-cuda:dev .   # from the repo root
#   docker run --rm --gpus all --ipc=host -e FLASHCP_RANKS_PER_NODE=8 \
#     -e FLASHCP_PLANNER=planner:50051 flashcp/worker-cuda:dev --strategy flashcp --steps 100
ARG BUILD_IMAGE=debian:12
ARG RUNTIME_IMAGE=debian:12-slim

FROM ${BUILD_IMAGE} AS build
ARG JOBS=
ARG FLASHCP_WERROR=ON
# 90 = Hopper (H100/H200).
ARG CUDA_ARCHITECTURES=90
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
# CMake finds /usr/local/cuda/bin/nvcc (top-level CMakeLists.txt) and the toolkit beside it.
COPY docker/cuda-wheels.sh docker/cuda-wheels.sh
RUN bash docker/cuda-wheels.sh devel /usr/local/cuda-13.0 \
 && ln -s cuda-13.0 /usr/local/cuda
COPY . .
# Only what the image ships: the worker and the GPU tests; no Python venv (torch) is needed.
RUN JOBS=${JOBS:-$(nproc)} FLASHCP_WERROR=${FLASHCP_WERROR} FLASHCP_SETUP_PYTHON=0 \
    BUILD_TARGETS="flashcp-worker worker_cuda_attention_test worker_cuda_communicator_test \
      worker_cuda_cp_step_test worker_cuda_rank_backend_test" \
    bash scripts/build.sh -DFLASHCP_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}
RUN set -eu; mkdir -p /out/bin /out/gpu-tests; \
    install -s build/bin/flashcp-worker /out/bin/; \
    install -m 0755 docker/flashcp-launch-ranks.sh /out/bin/flashcp-launch-ranks; \
    install -s build/tests/worker_cuda_*_test /out/gpu-tests/; \
    bash docker/runtime-packages.sh --ship /usr/local/cuda-13.0/lib /out/bin/flashcp-worker \
      /out/gpu-tests/* > /out/runtime-packages.txt; \
    cat /out/runtime-packages.txt

# The runtime libraries alone, from the same pins (no compiler, no headers).
FROM ${BUILD_IMAGE} AS cuda-runtime
COPY docker/cuda-wheels.sh /cuda-wheels.sh
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends python3-pip \
 && bash /cuda-wheels.sh runtime /usr/local/cuda-13.0

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
# The gRPC, protobuf, abseil, prometheus-cpp, Gloo and CBC runtime libraries; zlib for cuDNN.
RUN apt-get update -q \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y -q --no-install-recommends zlib1g \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin flashcp
# At the build stage's path, so the binaries' RUNPATH (/usr/local/cuda/lib) finds them; the
# ld.so.conf entry serves what cuDNN and NVRTC open at run time (dlopen).
COPY --from=cuda-runtime /usr/local/cuda-13.0/lib/ /usr/local/cuda-13.0/lib/
RUN ln -s cuda-13.0 /usr/local/cuda \
 && echo /usr/local/cuda-13.0/lib > /etc/ld.so.conf.d/flashcp-cuda.conf && ldconfig
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/gpu-tests/ /usr/local/libexec/flashcp/gpu-tests/
# libcuda.so.1 is mounted at run time by the NVIDIA container runtime; anything else missing fails.
RUN ! ldd /usr/local/bin/flashcp-worker /usr/local/libexec/flashcp/gpu-tests/* \
      /usr/local/cuda-13.0/lib/*.so* | grep 'not found' | grep -v -e 'libcuda\.so' -e 'libnvidia-'
USER 10001:10001
ENV FLASHCP_DEVICE=cuda \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"
EXPOSE 9470
ENTRYPOINT ["flashcp-launch-ranks"]
