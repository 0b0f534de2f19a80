# tcpx-rxdm container image: the `tcpx-daemon` sidecar (see deploy/README.md).
#
#   docker build -t tcpx-rxdm:0.1.0 .
#
# The runtime stage has no RUN step, so any glibc base works, including one
# with no shell at all:
#
#   docker build --build-arg RUNTIME_IMAGE=gcr.io/distroless/cc-debian12@sha256:<digest> .
#
# Both base images are pinned by version; pin them by digest in your registry
# for byte-for-byte rebuilds.
ARG RUST_IMAGE=rust:1.95.0-slim-bookworm
ARG RUNTIME_IMAGE=debian:12.12-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src

# Dependency layer: rebuilt only when the manifests, build script or protos change.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto/ proto/
RUN mkdir src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && cargo build --release --locked --bin tcpx-rxdm \
    && rm -rf src

# Our code. touch: the copied sources may be older than the placeholder build.
COPY presets/ presets/
COPY src/ src/
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin tcpx-rxdm

# The files of the runtime image, laid out once here (the runtime stage has no
# shell): our path, and the reference daemon's path for manifests that run it
# by that name.
RUN mkdir -p /out/usr/local/bin /out/tcpgpudmarxd/build/app \
    && cp target/release/tcpx-rxdm /out/usr/local/bin/tcpx-rxdm \
    && ln -s /usr/local/bin/tcpx-rxdm /out/tcpgpudmarxd/build/app/tcpgpudmarxd

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="tcpx-rxdm" \
      org.opencontainers.image.description="Receive-datapath manager for GPUDirect-TCPX NICs (drop-in tcpgpudmarxd replacement)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/ /
# libcuda is not in the image: GKE mounts the host driver's libraries at
# /usr/local/nvidia/lib64, and the daemon loads libcuda from there at run time.
ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64
# The HTTP endpoints (/metrics, /healthz, /readyz, /debug/*).
EXPOSE 9467
# Exec form: no shell between the runtime and the daemon, so SIGTERM reaches it.
ENTRYPOINT ["/usr/local/bin/tcpx-rxdm"]
CMD ["--gpu_nic_preset=auto", "--uds_path=/run/tcpx"]
