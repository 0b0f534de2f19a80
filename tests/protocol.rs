//! Black-box protocol tests: the real binary on simulated NICs and host pools,
//! real Unix sockets, byte-level assertions.

mod common;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::*;
use tcpx_rxdm::wire::client::{self, raw_bytes, status_code, FdReply};
use tcpx_rxdm::wire::proto::unix_socket_proto::Payload;

#[test]
fn socket_files_exist_and_are_not_world_writable() {
    let d = Daemon::start(&[]);
    let files = d.files();
    for name in [
        "rx_rule_manager",
        "rx_rule_uninstall",
        "queue_ids_by_gpu",
        "rxdm_application_registry",
        ".rxdm.lock",
    ] {
        assert!(files.contains(&name.to_string()), "{name} missing from {files:?}");
    }
    for gpu in [
        "0000:04:00.0",
        "0000:05:00.0",
        "0000:0a:00.0",
        "0000:0b:00.0",
        "0000:84:00.0",
        "0000:85:00.0",
        "0000:8a:00.0",
        "0000:8b:00.0",
    ] {
        assert!(files.contains(&format!("get_gpu_fd_{gpu}")));
        assert!(files.contains(&format!("get_gpu_metadata_{gpu}")));
    }
    for f in &files {
        let mode = std::fs::metadata(d.sock(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o007, 0, "{f} has mode {mode:o}");
        if f == "rxdm_status" {
            // Every client's flows: the daemon's user only (--status_socket_mode).
            assert_eq!(mode, 0o600, "{f}");
        } else if f == "nccl.env" {
            // Written where the host's layout allows it: readable, not writable, by the group.
            assert_eq!(mode, 0o640, "{f}");
        } else if !f.starts_with('.') {
            assert_eq!(mode, 0o660, "{f}");
        }
    }
}

#[test]
fn socket_mode_flag_is_applied() {
    let d = Daemon::start(&["--socket_mode=0600"]);
    let mode = std::fs::metadata(d.sock("rx_rule_manager")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn queue_ids_by_gpu_any_case_and_not_found() {
    let d = Daemon::start(&[]);
    let mut c = d.client("queue_ids_by_gpu");
    // Several requests on one long-lived connection, answered in order.
    for (gpu, want) in [
        ("0000:04:00.0", vec![8, 9, 10, 11]),
        ("0000:8B:00.0", vec![12, 13, 14, 15]),
        ("0000:0a:00.0", vec![8, 9, 10, 11]),
    ] {
        let r = c.request(&client::queue_query(gpu)).unwrap();
        match r.payload {
            Some(Payload::QueueIdResponse(q)) => assert_eq!(q.queue_ids, want, "{gpu}"),
            other => panic!("{gpu}: {other:?}"),
        }
        assert!(r.status.is_none());
    }
    let r = c.request(&client::queue_query("0000:99:00.0")).unwrap();
    assert_eq!(status_code(&r), 5);
    // A malformed address is INVALID_ARGUMENT, then the connection closes.
    let r = c.request(&client::queue_query("not-a-pci")).unwrap();
    assert_eq!(status_code(&r), 3);
    let mut rest = Vec::new();
    assert_eq!(c.stream().try_clone().unwrap().read_to_end(&mut rest).unwrap(), 0);
}

#[test]
fn install_reinstall_uninstall_v4_v6_and_by_dst() {
    let d = Daemon::start(&[]);
    // Exact bytes of the success reply.
    assert_eq!(
        raw_exchange(&d.sock("rx_rule_manager"), &encoded(&install_rule(40000, Some(GPU0)))),
        OK_FRAME
    );
    assert_eq!(
        raw_exchange(&d.sock("rx_rule_manager"), &encoded(&install_rule(40000, Some(GPU0)))),
        OK_FRAME,
        "re-install"
    );
    // IPv6 with an explicit GPU, in uppercase.
    let v6 = client::rule_request(
        5,
        ("fd00::2", 41000),
        ("fd00:0:0:1::2", 5000),
        Some("0000:05:00.0".to_uppercase().as_str()),
        Some(14),
    );
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&v6)), OK_FRAME);
    // Routed by dst address of sim eth3 (v4) and eth4 (v6): first GPU of that NIC.
    let by_dst = client::rule_request(1, ("10.9.0.2", 40001), ("192.168.3.2", 5000), None, None);
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&by_dst)), OK_FRAME);
    let by_dst6 = client::rule_request(5, ("fd00::9", 40002), ("fd00:0:0:4::2", 5000), None, None);
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&by_dst6)), OK_FRAME);

    let flows = d.flows();
    let nic =
        |name: &str| flows["nics"].as_array().unwrap().iter().find(|n| n["ifname"] == name).unwrap().clone();
    let eth1 = nic("eth1");
    assert_eq!(eth1["capacity"], 100000);
    assert_eq!(eth1["rules"].as_array().unwrap().len(), 2, "{eth1}");
    let r0 = &eth1["rules"][0];
    assert_eq!(
        (r0["loc"].as_u64(), r0["queue"].as_u64(), r0["gpu"].as_str(), r0["flow_type"].as_str()),
        (Some(0), Some(8), Some(GPU0), Some("tcp4"))
    );
    assert_eq!((r0["src"].as_str(), r0["dst"].as_str()), (Some("10.1.0.2:40000"), Some("192.168.1.2:5000")));
    // The installing process (this test) holds a lease on it.
    assert_eq!(r0["pid"].as_u64(), Some(u64::from(std::process::id())));
    assert_eq!((r0["lease"].as_bool(), r0["pending_delete"].as_bool()), (Some(true), Some(false)));
    let r1 = &eth1["rules"][1];
    assert_eq!(
        (r1["loc"].as_u64(), r1["queue"].as_u64(), r1["gpu"].as_str()),
        (Some(1), Some(14), Some("0000:05:00.0"))
    );
    assert_eq!((r1["src"].as_str(), r1["flow_type"].as_str()), (Some("[fd00::2]:41000"), Some("tcp6")));
    // The NIC's own table agrees.
    let nic_rules = eth1["nic_rules"].as_array().unwrap();
    assert_eq!(nic_rules.len(), 2);
    assert_eq!(nic_rules[1]["src"], "[fd00::2]:41000");
    assert_eq!(nic_rules[1]["queue"], 14);
    assert_eq!(nic("eth3")["rules"][0]["gpu"], "0000:84:00.0");
    assert_eq!(nic("eth4")["rules"][0]["gpu"], "0000:8a:00.0");

    // Uninstall (twice: the second is for an unknown flow, still "Ok.").
    for _ in 0..2 {
        assert_eq!(
            raw_exchange(&d.sock("rx_rule_uninstall"), &encoded(&install_rule(40000, Some(GPU0)))),
            OK_FRAME
        );
    }
    assert_eq!(raw_exchange(&d.sock("rx_rule_uninstall"), &encoded(&by_dst6)), OK_FRAME);
    let flows = d.flows();
    let eth1 = &flows["nics"][0];
    assert_eq!(eth1["rules"].as_array().unwrap().len(), 1);
    assert_eq!(eth1["nic_rules"].as_array().unwrap().len(), 1);
    assert!(flows["nics"][3]["rules"].as_array().unwrap().is_empty());
}

#[test]
fn not_found_without_a_route() {
    let d = Daemon::start(&[]);
    let mut c = d.client("rx_rule_manager");
    let r = c.request(&client::rule_request(1, ("10.1.0.2", 1), ("10.99.0.1", 2), None, None)).unwrap();
    assert_eq!(status_code(&r), 5);
    assert_ne!(raw_bytes(&r), Some(&b"Ok."[..]));
    let r = c
        .request(&client::rule_request(1, ("10.1.0.2", 1), ("10.99.0.1", 2), Some("0000:99:00.0"), None))
        .unwrap();
    assert_eq!(status_code(&r), 5);
    // The connection stays usable after a NOT_FOUND.
    assert_eq!(raw_bytes(&c.request(&install_rule(7, Some(GPU0))).unwrap()), Some(&b"Ok."[..]));
}

#[test]
fn garbage_and_wrong_payloads_are_invalid_argument_and_close() {
    let d = Daemon::start(&[]);
    let bad_requests: Vec<Vec<u8>> = vec![
        vec![0, 3, 0x0a, 100, 0],            // truncated field inside a complete frame
        vec![0, 1, 0x0f],                    // impossible wire type
        encoded(&client::queue_query(GPU0)), // wrong payload type
        encoded(&client::rule_request(7, ("10.1.0.2", 1), ("192.168.1.2", 2), None, None)), // unknown flow_type
        encoded(&client::rule_request(1, ("10.1.0.999", 1), ("192.168.1.2", 2), None, None)), // bad IP
        encoded(&client::rule_request(1, ("10.1.0.2", 70000), ("192.168.1.2", 2), None, None)), // bad port
        encoded(&client::rule_request(1, ("fd00::1", 1), ("192.168.1.2", 2), None, None)),  // family mismatch
        vec![0, 0], // empty message: no payload
    ];
    for req in bad_requests {
        for sock in ["rx_rule_manager", "rx_rule_uninstall"] {
            let mut c = d.client(sock);
            c.send_bytes(&req).unwrap();
            let r = c.recv().unwrap();
            assert_eq!(status_code(&r), 3, "{sock} {req:?}");
            let mut rest = Vec::new();
            assert_eq!(
                c.stream().try_clone().unwrap().read_to_end(&mut rest).unwrap(),
                0,
                "connection closed"
            );
        }
    }
    // Nothing was installed by any of it, and the daemon still serves.
    assert!(d.flows()["nics"][0]["rules"].as_array().unwrap().is_empty());
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&install_rule(1, Some(GPU0)))), OK_FRAME);
}

#[test]
fn truncated_frame_does_not_disturb_the_daemon() {
    let d = Daemon::start(&[]);
    for cut in [1usize, 2, 5] {
        let full = encoded(&install_rule(9, Some(GPU0)));
        let mut c = d.client("rx_rule_manager");
        c.send_bytes(&full[..cut]).unwrap();
        drop(c);
    }
    // A frame that announces more than it sends, then the client goes away.
    let mut c = d.client("rx_rule_manager");
    c.send_bytes(&[0xff, 0xff, 1, 2, 3]).unwrap();
    drop(c);
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&install_rule(9, Some(GPU0)))), OK_FRAME);
}

#[test]
fn pool_fd_matches_metadata_and_is_shared_memory() {
    let d = Daemon::start(&[]);
    let name = format!("get_gpu_metadata_{GPU0}");
    let mut c = d.client(&name);
    let meta = c.request(&client::raw_request(GPU0)).unwrap();
    let meta = raw_bytes(&meta).expect("raw_bytes").to_vec();
    assert_eq!(meta.len(), 24);
    let fd_num = i32::from_le_bytes(meta[0..4].try_into().unwrap());
    assert!(fd_num > 2, "daemon fd number {fd_num}");
    assert_eq!(&meta[4..8], &[0, 0, 0, 0]);
    let size = u64::from_le_bytes(meta[8..16].try_into().unwrap());
    let align = u64::from_le_bytes(meta[16..24].try_into().unwrap());
    assert_eq!((size, align), (64 << 20, 4096));

    let fetch = || {
        let mut c = d.client(&format!("get_gpu_fd_{GPU0}"));
        c.send(&client::raw_request(GPU0)).unwrap();
        match c.recv_fd_reply().unwrap() {
            FdReply::Fd(fd) => fd,
            FdReply::Message(m) => panic!("no fd: {m:?}"),
        }
    };
    let (a, b) = (fetch(), fetch());
    assert_eq!(nix::sys::stat::fstat(&a).unwrap().st_size as u64, size);
    // Received with MSG_CMSG_CLOEXEC.
    let flags = nix::fcntl::fcntl(&a, nix::fcntl::FcntlArg::F_GETFD).unwrap();
    assert_ne!(flags & libc::FD_CLOEXEC, 0);
    // Both fds are the same memory: write through one, read through the other.
    let fa = std::fs::File::from(a);
    let fb = std::fs::File::from(b);
    use std::os::unix::fs::FileExt;
    fa.write_all_at(b"tcpx-pattern", 4096).unwrap();
    let mut got = [0u8; 12];
    fb.read_exact_at(&mut got, 4096).unwrap();
    assert_eq!(&got, b"tcpx-pattern");

    // Upper-case request on the right socket works too.
    let mut c = d.client(&format!("get_gpu_fd_{GPU0}"));
    c.send(&client::raw_request(&GPU0.to_uppercase())).unwrap();
    assert!(matches!(c.recv_fd_reply().unwrap(), FdReply::Fd(_)));
}

#[test]
fn wrong_pci_gets_no_fd() {
    let d = Daemon::start(&[]);
    for wrong in ["0000:99:00.0", "0000:05:00.0", "garbage"] {
        let mut c = d.client(&format!("get_gpu_fd_{GPU0}"));
        c.send(&client::raw_request(wrong)).unwrap();
        match c.recv_fd_reply().unwrap() {
            FdReply::Message(m) => assert_eq!(status_code(&m), 5, "{wrong}"),
            FdReply::Fd(_) => panic!("{wrong}: got an fd"),
        }
        let mut c = d.client(&format!("get_gpu_metadata_{GPU0}"));
        let m = c.request(&client::raw_request(wrong)).unwrap();
        assert_eq!(status_code(&m), 3);
        assert_eq!(raw_bytes(&m), Some(&b"Not found."[..]));
    }
    // A non-raw payload on an fd endpoint: INVALID_ARGUMENT, no fd.
    let mut c = d.client(&format!("get_gpu_fd_{GPU0}"));
    c.send(&client::queue_query(GPU0)).unwrap();
    match c.recv_fd_reply().unwrap() {
        FdReply::Message(m) => assert_eq!(status_code(&m), 3),
        FdReply::Fd(_) => panic!("got an fd"),
    }
}

#[test]
fn rule_slots_exhaust_at_max_rx_rules_and_come_back() {
    let d = Daemon::start(&["--max_rx_rules=16"]);
    for p in 0..16 {
        assert_eq!(
            raw_exchange(&d.sock("rx_rule_manager"), &encoded(&install_rule(1000 + p, Some(GPU0)))),
            OK_FRAME,
            "{p}"
        );
    }
    let mut c = d.client("rx_rule_manager");
    let r = c.request(&install_rule(2000, Some(GPU0))).unwrap();
    assert_eq!(status_code(&r), 8, "RESOURCE_EXHAUSTED");
    assert!(String::from_utf8_lossy(raw_bytes(&r).unwrap()).contains("16"));
    assert_eq!(
        raw_exchange(&d.sock("rx_rule_uninstall"), &encoded(&install_rule(1005, Some(GPU0)))),
        OK_FRAME
    );
    assert_eq!(raw_exchange(&d.sock("rx_rule_manager"), &encoded(&install_rule(2000, Some(GPU0)))), OK_FRAME);
    let flows = d.flows();
    let rules = flows["nics"][0]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 16);
    let slot = rules.iter().find(|r| r["src"] == "10.1.0.2:2000").unwrap();
    assert_eq!(slot["loc"], 5, "the freed slot is reused");
    // Queues stay balanced over the GPU's four queues.
    let mut per_queue = std::collections::BTreeMap::new();
    for r in rules {
        *per_queue.entry(r["queue"].as_u64().unwrap()).or_insert(0) += 1;
    }
    assert_eq!(per_queue.values().copied().collect::<Vec<_>>(), vec![4, 4, 4, 4]);
}

#[test]
fn nic_errors_map_to_status_codes_without_leaking_slots() {
    for (fault, code) in [("EBUSY", 14), ("EAGAIN", 14), ("ENOSPC", 8), ("EINVAL", 3), ("EIO", 13)] {
        let d = Daemon::start(&[&format!("--sim_fault=add_rule:{fault}:1")]);
        let mut c = d.client("rx_rule_manager");
        let r = c.request(&install_rule(1, Some(GPU0))).unwrap();
        assert_eq!(status_code(&r), code, "{fault}");
        assert_ne!(raw_bytes(&r), Some(&b"Ok."[..]));
        // The connection stays open for a NIC error (not malformed input).
        let r = c.request(&install_rule(2, Some(GPU0))).unwrap();
        assert_eq!(status_code(&r), code);
        let flows = d.flows();
        assert!(flows["nics"][0]["rules"].as_array().unwrap().is_empty(), "{fault}: slot leaked");
    }
}

#[test]
fn many_requests_on_one_connection_answer_in_order() {
    let d = Daemon::start(&[]);
    let mut c = d.client("rx_rule_manager");
    // Pipeline 50 requests, then read 50 replies.
    let mut batch = Vec::new();
    for p in 0..50 {
        batch.extend(encoded(&install_rule(3000 + p, Some(GPU0))));
    }
    batch.extend(encoded(&install_rule(3000, Some("0000:99:00.0"))));
    c.send_bytes(&batch).unwrap();
    for p in 0..50 {
        assert_eq!(raw_bytes(&c.recv().unwrap()), Some(&b"Ok."[..]), "{p}");
    }
    assert_eq!(status_code(&c.recv().unwrap()), 5, "the 51st reply is the 51st request's");
    let flows = d.flows();
    let locs: Vec<u64> =
        flows["nics"][0]["rules"].as_array().unwrap().iter().map(|r| r["loc"].as_u64().unwrap()).collect();
    assert_eq!(locs, (0..50).collect::<Vec<_>>());
}

#[test]
fn metrics_and_health_endpoints() {
    let d = Daemon::start(&[]);
    assert_eq!(d.http_get("/healthz").0, 200);
    assert_eq!(d.http_get("/readyz"), (200, "ready\n".to_string()));
    raw_exchange(&d.sock("rx_rule_manager"), &encoded(&install_rule(1, Some(GPU0))));
    raw_exchange(&d.sock("rx_rule_manager"), &encoded(&install_rule(1, Some("0000:99:00.0"))));
    // A rule request is counted by its NIC's thread just after the reply is
    // sent: a scrape right after the reply may come before it.
    let counted = [
        r#"tcpx_rxdm_rule_requests_total{code="OK",op="install"} 1"#,
        r#"tcpx_rxdm_rule_requests_total{code="NOT_FOUND",op="install"} 1"#,
        r#"tcpx_rxdm_rules_installed{nic="eth1"} 1"#,
    ];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (status, body) = loop {
        let (status, body) = d.http_get("/metrics");
        if status != 200 || counted.iter().all(|c| body.contains(c)) || std::time::Instant::now() > deadline {
            break (status, body);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status, 200);
    assert!(body.contains(r#"tcpx_rxdm_rule_requests_total{code="OK",op="install"} 1"#), "{body}");
    assert!(body.contains(r#"tcpx_rxdm_rule_requests_total{code="NOT_FOUND",op="install"} 1"#));
    assert!(body.contains(r#"tcpx_rxdm_rules_installed{nic="eth1"} 1"#));
    assert!(body.contains(r#"tcpx_rxdm_rule_slots{nic="eth1"} 100000"#));
    assert!(body.contains(r#"tcpx_rxdm_pool_size_bytes{gpu="0000:04:00.0"} 67108864"#));
    assert!(body.contains("tcpx_rxdm_ready 1"));
    let (status, cfg) = d.http_get("/debug/config");
    assert_eq!(status, 200);
    let cfg: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    assert_eq!(cfg["backends"]["nic"], "sim");
    assert_eq!(cfg["topology"]["nics"][3]["gpus"][1]["pci"], "0000:8b:00.0");
    assert_eq!(d.http_get("/nope").0, 404);
}

#[test]
fn connection_limit_makes_extra_clients_wait() {
    let d = Daemon::start(&["--max_connections=2"]);
    let idle1 = d.client("queue_ids_by_gpu");
    let mut idle2 = d.client("queue_ids_by_gpu");
    assert!(idle2.request(&client::queue_query(GPU0)).is_ok());
    let mut third = d.client("queue_ids_by_gpu");
    third.stream().set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    third.send(&client::queue_query(GPU0)).unwrap();
    assert!(third.recv().is_err(), "served beyond --max_connections");
    drop(idle1);
    third.stream().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(matches!(third.recv().unwrap().payload, Some(Payload::QueueIdResponse(_))));
}

#[test]
#[ignore = "needs root: chown to a group the user is not in"]
fn socket_group_flag_sets_the_group() {
    require_root("chown to a group the user is not in");
    use std::os::unix::fs::MetadataExt;
    // Debian's `daemon` group has gid 1; a numeric gid works as well.
    for (flag, gid) in [("--socket_group=daemon", 1), ("--socket_group=2", 2)] {
        let d = Daemon::start(&[flag]);
        for name in ["rx_rule_manager", "get_gpu_fd_0000:04:00.0"] {
            assert_eq!(std::fs::metadata(d.sock(name)).unwrap().gid(), gid, "{flag} {name}");
        }
    }
    let (code, err) =
        run_to_exit(&["--gpu_nic_preset=sim", "--metrics_address=", "--socket_group=no-such-group-x"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--socket_group"), "{err}");
}
