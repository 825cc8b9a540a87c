# syntax=docker/dockerfile:1
# flashcp-worker for CPU ranks (--device cpu): built on Debian 12 with the README's scripts,
# shipped on debian:12-slim with the runtime libraries only, as a non-root user.
# The entrypoint is the rank launcher: one flashcp-worker per local rank (see
# docker/flashcp-launch-ranks.sh); run flashcp-worker directly with --entrypoint.
#
#   docker build -f docker/worker-cpu.Dockerfile -t flashcp/worker-cpu:dev .   # from the repo root
ARG BUILD_IMAGE=debian:12
ARG RUNTIME_IMAGE=debian:12-slim

FROM ${BUILD_IMAGE} AS build
ARG JOBS=
ARG FLASHCP_WERROR=ON
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN JOBS=${JOBS:-$(nproc)} FLASHCP_WERROR=${FLASHCP_WERROR} \
    bash scripts/build.sh -DFLASHCP_CUDA=OFF -DCMAKE_BUILD_TYPE=Release
RUN set -eu; mkdir -p /out/bin; \
    install -s build/bin/flashcp-worker /out/bin/; \
    install -m 0755 docker/flashcp-launch-ranks.sh /out/bin/flashcp-launch-ranks; \
    bash docker/runtime-packages.sh /out/bin/flashcp-worker > /out/runtime-packages.txt; \
    cat /out/runtime-packages.txt

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update -q \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y -q --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin flashcp
COPY --from=build /out/bin/ /usr/local/bin/
RUN ! ldd /usr/local/bin/flashcp-worker | grep 'not found'
USER 10001:10001
ENV FLASHCP_DEVICE=cpu
# Local rank k serves metrics on 9470 + k.
EXPOSE 9470
ENTRYPOINT ["flashcp-launch-ranks"]
