//! The check against the a3-highgpu-8g layout: each listed problem is found,
//! and the generated environment passes.

use std::collections::BTreeMap;
use std::path::Path;

use super::check::{check, parse_env_file, Expect, ProblemKind};
use super::env::{self, generate, NcclEnv};
use super::{bindings, FakeNode};

fn node() -> FakeNode {
    FakeNode::a3_highgpu_8g()
}

fn ifs() -> Vec<String> {
    FakeNode::a3_ifnames()
}

fn generated() -> NcclEnv {
    generate(&node(), &ifs(), Path::new("/run/tcpx")).unwrap()
}

fn vars(env: &NcclEnv) -> BTreeMap<String, String> {
    env.vars.iter().map(|v| (v.name.clone(), v.value.clone())).collect()
}

/// The problems of `vars`, as (variable, kind) pairs.
fn problems(vars: &BTreeMap<String, String>) -> Vec<(String, ProblemKind)> {
    let names = ifs();
    let nics = bindings::compute(&node(), &names).unwrap();
    let g = generated();
    let expect = Expect { ifnames: &names, prefix: "/run/tcpx", nics: &nics, generated: Some(&g) };
    check(vars, &expect).into_iter().map(|p| (p.variable, p.kind)).collect()
}

fn with(name: &str, value: Option<&str>) -> BTreeMap<String, String> {
    let mut v = vars(&generated());
    match value {
        Some(x) => v.insert(name.to_string(), x.to_string()),
        None => v.remove(name),
    };
    v
}

#[test]
fn the_generated_environment_passes() {
    assert_eq!(problems(&vars(&generated())), []);
}

#[test]
fn the_overlapping_published_rx_bindings_are_found() {
    let v = with(
        env::RX_BINDINGS,
        Some("eth1:22-35,124-139;eth2:22-35,124-139;eth3:74-87,178-191;eth4:74-87,178-191"),
    );
    assert_eq!(
        problems(&v),
        [
            (env::RX_BINDINGS.to_string(), ProblemKind::TxRxOverlap),
            (env::RX_BINDINGS.to_string(), ProblemKind::TxRxOverlap)
        ]
    );
    let names = ifs();
    let expect = Expect { ifnames: &names, prefix: "/run/tcpx", nics: &[], generated: None };
    let p = check(&v, &expect);
    assert_eq!(p[0].message, "eth1: CPUs 124-125 are in both the TX and the RX bindings");
}

#[test]
fn the_tmp_prefix_and_a_missing_prefix_are_found() {
    assert_eq!(
        problems(&with(env::UNIX_CLIENT_PREFIX, Some("/tmp"))),
        [(env::UNIX_CLIENT_PREFIX.into(), ProblemKind::WrongPrefix)]
    );
    assert_eq!(
        problems(&with(env::UNIX_CLIENT_PREFIX, None)),
        [(env::UNIX_CLIENT_PREFIX.into(), ProblemKind::Missing)]
    );
    // A trailing slash is the same folder.
    assert_eq!(problems(&with(env::UNIX_CLIENT_PREFIX, Some("/run/tcpx/"))), []);
    let long = format!("/{}", "x".repeat(80));
    assert_eq!(
        problems(&with(env::UNIX_CLIENT_PREFIX, Some(&long))),
        [
            (env::UNIX_CLIENT_PREFIX.into(), ProblemKind::WrongPrefix),
            (env::UNIX_CLIENT_PREFIX.into(), ProblemKind::PrefixTooLong)
        ]
    );
}

#[test]
fn missing_and_unmanaged_ifnames_are_found() {
    assert_eq!(
        problems(&with(env::SOCKET_IFNAME, Some("eth1,eth2,eth3"))),
        [(env::SOCKET_IFNAME.into(), ProblemKind::MissingIfname)]
    );
    assert_eq!(
        problems(&with(env::SOCKET_IFNAME, Some("eth1,eth2,eth3,eth4,eth5"))),
        [(env::SOCKET_IFNAME.into(), ProblemKind::UnmanagedIfname)]
    );
    assert_eq!(
        problems(&with(env::CTRL_DEV, Some("eth1"))),
        [(env::CTRL_DEV.into(), ProblemKind::CtrlDevIsDataNic)]
    );
}

#[test]
fn lifecycle_reporting_off_is_found() {
    for v in [None, Some("0"), Some("")] {
        assert_eq!(
            problems(&with(env::REPORT_LIFECYCLE, v)),
            [(env::REPORT_LIFECYCLE.into(), ProblemKind::LifecycleOff)]
        );
    }
}

#[test]
fn bindings_on_the_wrong_node_or_nic_are_found() {
    let v =
        with(env::TX_BINDINGS, Some("eth1:60-73;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177"));
    assert_eq!(problems(&v), [(env::TX_BINDINGS.into(), ProblemKind::WrongNumaNode)]);
    let v = with(env::TX_BINDINGS, Some("eth1:8-21;eth2:8-21;eth3:60-73;eth9:60-73"));
    assert_eq!(
        problems(&v),
        [
            (env::TX_BINDINGS.into(), ProblemKind::BindingUnmanagedNic),
            (env::TX_BINDINGS.into(), ProblemKind::BindingMissingNic)
        ]
    );
    assert_eq!(
        problems(&with(env::RX_BINDINGS, Some("eth1"))),
        [(env::RX_BINDINGS.into(), ProblemKind::Malformed)]
    );
    assert_eq!(problems(&with(env::TX_BINDINGS, None)), [(env::TX_BINDINGS.into(), ProblemKind::Missing)]);
}

#[test]
fn the_env_file_form_reads_back_exactly() {
    let g = generated();
    assert_eq!(parse_env_file(&g.to_env()).unwrap(), vars(&g));
    let text = "# c\n\nexport A='x'\\''y'\nB=\"q \\\"r\\\"\"\nC=plain\n";
    let v = parse_env_file(text).unwrap();
    assert_eq!(v["A"], "x'y");
    assert_eq!(v["B"], "q \"r\"");
    assert_eq!(v["C"], "plain");
    assert_eq!(parse_env_file("A=1\nnot a line\n"), Err(2));
    assert_eq!(parse_env_file("A='open\n"), Err(1));
}

#[test]
fn on_a_node_too_small_for_bindings_their_absence_is_right_and_every_finding_has_a_fix() {
    // One core (two threads): the settings leave both bindings out, with a note.
    let small = FakeNode::smt2(1, 1).nic("eth1", None).nic("eth0", None);
    let names = vec!["eth1".to_string()];
    let g = generate(&small, &names, Path::new("/run/tcpx")).unwrap();
    assert!(g.get(env::TX_BINDINGS).is_none() && g.get(env::RX_BINDINGS).is_none());
    assert!(
        g.notes.iter().any(|n| n.contains(env::TX_BINDINGS) && n.contains("at least 4")),
        "{:?}",
        g.notes
    );
    let expect = Expect { ifnames: &names, prefix: "/run/tcpx", nics: &[], generated: Some(&g) };
    assert_eq!(check(&vars(&g), &expect), [], "the generated settings pass");
    // Bindings set by hand that overlap: the fix is to unset them; the others have a value.
    let mut v = vars(&g);
    v.insert(env::TX_BINDINGS.into(), "eth1:0-1".into());
    v.insert(env::RX_BINDINGS.into(), "eth1:1".into());
    v.insert(env::REPORT_LIFECYCLE.into(), "0".into());
    let found = check(&v, &expect);
    assert!(!found.is_empty());
    for p in &found {
        let fixed = p.fix.is_some() != p.unset;
        assert!(fixed, "{} {:?}: no fix", p.variable, p.kind);
    }
    let overlap = found.iter().find(|p| p.kind == ProblemKind::TxRxOverlap).expect("the overlap is found");
    assert!(overlap.unset && overlap.fix.is_none());
    let lifecycle = found.iter().find(|p| p.kind == ProblemKind::LifecycleOff).unwrap();
    assert_eq!(lifecycle.fix.as_deref(), Some("1"));
}
