//! Compiles our `.proto` files with protox (pure Rust, no `protoc` binary) and
//! prost-build, and keeps the descriptor set so the textproto loader can use it.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files =
        ["proto/unix_socket_message.proto", "proto/gpu_rxq_configuration.proto", "proto/handover.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-changed=proto/google/rpc/status.proto");
    let fds = protox::compile(files, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let bytes = prost::Message::encode_to_vec(&fds);
    std::fs::write(out.join("descriptors.bin"), bytes)?;
    // A takeover's state is large: boxed, so that a refusal stays small.
    prost_build::Config::new().boxed(".tcpx_rxdm.handover.Offer.answer.state").compile_fds(fds)?;
    Ok(())
}
