# tcpx-rxdm container image: the `tcpx-daemon` sidecar (see deploy/README.md).
#
#   deploy/build-image.sh -t tcpx-rxdm:0.1.0
#
# The script passes VERSION (from Cargo.toml) and REVISION (from git) for the
# image's labels; a plain `docker build -t tcpx-rxdm:0.1.0 .` works too and
# leaves those two labels empty. The runtime stage has no RUN step, so any
# glibc base works, including one with no shell at all:
#
#   deploy/build-image.sh --build-arg RUNTIME_IMAGE=gcr.io/distroless/cc-debian12@sha256:<digest> -t ...
#
# The binary's debug info is split off into its own stage, for crash reports:
#
#   docker build --target debug-symbols --output type=local,dest=symbols .
#
# Both base images are pinned by version; pin them by digest in your registry
# for byte-for-byte rebuilds.
ARG RUST_IMAGE=rust:1.95.0-slim-bookworm
ARG RUNTIME_IMAGE=debian:12.12-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src

# Dependency layer: rebuilt only when the manifests, build script or protos
# change. Every target the manifest names needs a file: placeholders here.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto/ proto/
RUN mkdir -p src examples/bench \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > examples/bench/main.rs \
    && cargo build --release --locked --bin tcpx-rxdm \
    && rm -rf src examples

# Our code. touch: the copied sources may be older than the placeholder build.
COPY presets/ presets/
COPY examples/ examples/
COPY src/ src/
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin tcpx-rxdm

# The files of the runtime image, laid out once here (the runtime stage has no
# shell): our path, and the reference daemon's path for manifests that run it
# by that name. The debug info (line tables) goes to /debug; the binary keeps
# its symbol table, so a backtrace names functions, and a link to the file
# (.gnu_debuglink, plus the build id) that gdb follows.
RUN mkdir -p /out/usr/local/bin /out/tcpgpudmarxd/build/app /debug \
    && objcopy --only-keep-debug --compress-debug-sections target/release/tcpx-rxdm /debug/tcpx-rxdm.debug \
    && objcopy --strip-debug --add-gnu-debuglink=/debug/tcpx-rxdm.debug target/release/tcpx-rxdm /out/usr/local/bin/tcpx-rxdm \
    && ln -s /usr/local/bin/tcpx-rxdm /out/tcpgpudmarxd/build/app/tcpgpudmarxd

# VERSION must be Cargo.toml's: a mismatch fails the build rather than
# labelling the image wrongly.
ARG VERSION=
RUN test -z "$VERSION" || grep -qx "version = \"$VERSION\"" Cargo.toml \
    || { echo "VERSION=$VERSION but Cargo.toml says $(grep -m1 '^version' Cargo.toml)" >&2; exit 1; }

# `--target debug-symbols`: only the split debug info, matching the image
# built from the same sources.
FROM scratch AS debug-symbols
COPY --from=build /debug/ /

FROM ${RUNTIME_IMAGE}
ARG VERSION=
ARG REVISION=
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
