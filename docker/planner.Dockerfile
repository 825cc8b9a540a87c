# syntax=docker/dockerfile:1
# flashcp-planner: built on Debian 12 with the README's own scripts, shipped on debian:12-slim
# with only the shared-library packages the binaries load, as a non-root user.
#
#   docker build -f docker/planner.Dockerfile -t flashcp/planner:dev .      # from the repo root
#   docker run --rm -p 50051:50051 -p 9464:9464 flashcp/planner:dev
ARG BUILD_IMAGE=debian:12
ARG RUNTIME_IMAGE=debian:12-slim

FROM ${BUILD_IMAGE} AS build
ARG JOBS=
ARG FLASHCP_WERROR=ON
WORKDIR /src
# Dependencies first, so source edits do not re-run apt.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN JOBS=${JOBS:-$(nproc)} FLASHCP_WERROR=${FLASHCP_WERROR} \
    bash scripts/build.sh -DFLASHCP_CUDA=OFF -DCMAKE_BUILD_TYPE=Release
# flashcp-planner is required; the client tools ride along for debugging from inside the pod.
RUN set -eu; mkdir -p /out/bin; \
    install -s build/bin/flashcp-planner /out/bin/; \
    for b in flashcp-client flashcp-plan flashcp-loadgen; do \
      if [ -x "build/bin/$b" ]; then install -s "build/bin/$b" /out/bin/; fi; \
    done; \
    bash docker/runtime-packages.sh /out/bin/* > /out/runtime-packages.txt; \
    cat /out/runtime-packages.txt

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update -q \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y -q --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin flashcp
COPY --from=build /out/bin/ /usr/local/bin/
# Fail the build, not the pod, if a shared library is missing.
RUN ! ldd /usr/local/bin/flashcp-* | grep 'not found'
USER 10001:10001
# gRPC API and Prometheus metrics. Kubernetes probes the standard gRPC health service.
EXPOSE 50051 9464
ENTRYPOINT ["flashcp-planner"]
CMD ["--listen", "0.0.0.0:50051", "--metrics", "0.0.0.0:9464"]
