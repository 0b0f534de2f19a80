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
    // The packed rule tables are decoded without a copy (slices of the read buffer).
    prost_build::Config::new()
        .boxed(".tcpx_rxdm.handover.Offer.answer.state")
        .bytes([".tcpx_rxdm.handover.RuleTable.rules", ".tcpx_rxdm.handover.SimNic.rules"])
        .compile_fds(fds)?;
    Ok(())
}
