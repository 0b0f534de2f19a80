# tcpx-rxdm container image: the `tcpx-daemon` sidecar.
# Build: docker build -t tcpx-rxdm .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin tcpx-rxdm

FROM debian:bookworm-slim
# libcuda is not in the image: the GPU operator / host driver mounts it, and the
# daemon loads it at run time (a missing libcuda is a clean error, not a crash).
COPY --from=build /src/target/release/tcpx-rxdm /usr/local/bin/tcpx-rxdm
ENTRYPOINT ["/usr/local/bin/tcpx-rxdm"]
CMD ["--gpu_nic_preset=auto", "--uds_path=/run/tcpx"]
