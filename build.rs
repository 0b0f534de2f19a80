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
    sibling_ptrace_cfg();
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

/// Tests that start a second daemon beside the first (a takeover from outside)
/// need the kernel to let it take the first daemon's descriptors. Yama's
/// `ptrace_scope` 1 or more lets only an ancestor, or a process with
/// `CAP_SYS_PTRACE`, do that: built without that capability on such a kernel,
/// those tests are reported as ignored, with the reason, instead of failing.
fn sibling_ptrace_cfg() {
    println!("cargo:rustc-check-cfg=cfg(sibling_ptrace_blocked)");
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u8>().ok())
        .unwrap_or(0);
    const CAP_SYS_PTRACE: u32 = 19;
    let can_ptrace = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim().to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0);
    if scope >= 1 && !can_ptrace {
        println!("cargo:rustc-cfg=sibling_ptrace_blocked");
    }
}
