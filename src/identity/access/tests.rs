//! Unit tests of the tenant checks.
use super::*;
use crate::identity::held::NotRead;
use crate::identity::tenant::FilesRead;
use crate::identity::{Client, ClientInfo};

fn policy(mode: TenantIsolation, max_rules: u32) -> (TenantPolicy, Arc<Metrics>) {
    let m = Arc::new(Metrics::new());
    let devices = GpuDevices { minors: vec![0, 1, 2], simulated: true };
    (TenantPolicy::new(mode, max_rules, devices, None, Some(m.clone())), m)
}

fn client(cgroup: u64, gpus: u64) -> Client {
    Client::from(ClientInfo {
        tenant: Some(Arc::new(Tenant::for_test(cgroup, gpus))),
        ..ClientInfo::default()
    })
}

fn refused(m: &Metrics, endpoint: &str, reason: Refusal, mode: &str) -> u64 {
    m.requests_refused.with_label_values(&[endpoint, reason.name(), mode]).get()
}

#[test]
fn a_gpu_is_usable_only_where_its_device_node_is_held() {
    let (p, m) = policy(TenantIsolation::Enforce, 0);
    let a = client(10, 0b001);
    assert_eq!(p.check_gpu("gpu_fd", &a, 0, &"0000:04:00.0"), Ok(()));
    let d = p.check_gpu("gpu_fd", &a, 2, &"0000:0a:00.0").unwrap_err();
    assert_eq!(d.code(), StatusCode::PermissionDenied);
    assert!(d.message.contains("0000:0a:00.0") && d.message.contains("/dev/nvidia2"), "{}", d.message);
    assert_eq!(refused(&m, "gpu_fd", Refusal::Gpu, "enforce"), 1);
}

#[test]
fn a_gpu_refusal_says_when_the_clients_files_were_not_all_read() {
    let (p, _) = policy(TenantIsolation::Enforce, 0);
    let with = |files| {
        let mut t = Tenant::for_test(10, 0b001);
        t.files = files;
        let c = Client::from(ClientInfo { tenant: Some(Arc::new(t)), ..ClientInfo::default() });
        p.check_gpu("gpu_fd", &c, 2, &"0000:0a:00.0").unwrap_err().message
    };
    let all = with(FilesRead::All);
    assert!(!all.contains("descriptors") && all.contains("does not hold /dev/nvidia2"), "{all}");
    let more = with(FilesRead::UpToLimit);
    assert!(more.contains("descriptors 0 to 4095") && more.contains("cuInit"), "{more}");
    let unknown = with(FilesRead::Unknown);
    assert!(unknown.contains("descriptors 0 to 4095") && !unknown.contains("held more"), "{unknown}");
}

#[test]
fn a_gpu_refusal_says_why_the_clients_files_were_not_read() {
    let (p, _) = policy(TenantIsolation::Enforce, 0);
    let with = |why| {
        let mut t = Tenant::for_test(10, 0);
        t.files = FilesRead::None(why);
        let c = Client::from(ClientInfo { tenant: Some(Arc::new(t)), ..ClientInfo::default() });
        p.check_gpu("gpu_fd", &c, 0, &"0000:04:00.0").unwrap_err().message
    };
    let unlisted = with(NotRead::Unlisted);
    assert!(
        unlisted.contains("cannot tell whether its process holds /dev/nvidia0")
            && unlisted.contains("another user")
            && unlisted.contains("CAP_DAC_READ_SEARCH")
            && !unlisted.contains("does not hold /dev"),
        "{unlisted}"
    );
    let hidden = with(NotRead::Hidden);
    assert!(hidden.contains("pid is not visible") && hidden.contains("/proc/<pid>"), "{hidden}");
    let refused = with(NotRead::Refused(nix::errno::Errno::EACCES));
    assert!(refused.contains("did not show them") && refused.contains("EACCES"), "{refused}");
}

#[test]
fn audit_decides_the_same_but_serves() {
    let (p, m) = policy(TenantIsolation::Audit, 0);
    let a = client(10, 0b001);
    assert_eq!(p.check_gpu("gpu_fd", &a, 2, &"0000:0a:00.0"), Ok(()));
    assert_eq!(p.check_gpu("gpu_fd", &Client::default(), 0, &"0000:04:00.0"), Ok(()));
    assert_eq!(refused(&m, "gpu_fd", Refusal::Gpu, "audit"), 1);
    assert_eq!(refused(&m, "gpu_fd", Refusal::Unidentified, "audit"), 1);
    assert_eq!(refused(&m, "gpu_fd", Refusal::Gpu, "enforce"), 0);
}

#[test]
fn off_checks_nothing_and_counts_nothing() {
    let p = TenantPolicy::off();
    assert!(!p.checks());
    assert_eq!(p.check_gpu("gpu_fd", &Client::default(), 5, &"x"), Ok(()));
    assert_eq!(p.check_owner("rule_uninstall", &Client::default(), Some(3), &"f", false), Ok(()));
    assert_eq!(p.take_rule("rule_manager", &Client::default(), Some(3)), Ok(()));
}

#[test]
fn an_unidentified_client_is_refused_with_the_fix() {
    let (p, m) = policy(TenantIsolation::Enforce, 0);
    let d = p.check_gpu("gpu_fd", &Client::default(), 0, &"0000:04:00.0").unwrap_err();
    assert_eq!(d.reason, Refusal::Unidentified);
    assert!(d.message.contains("hostPID") && d.message.contains("shareProcessNamespace"), "{}", d.message);
    assert_eq!(refused(&m, "gpu_fd", Refusal::Unidentified, "enforce"), 1);
}

#[test]
fn an_exited_opener_is_refused_saying_so() {
    let (p, m) = policy(TenantIsolation::Enforce, 0);
    let gone = Client::from(ClientInfo { opener_exited: true, ..ClientInfo::default() });
    let d = p.check_gpu("gpu_fd", &gone, 0, &"0000:04:00.0").unwrap_err();
    assert_eq!(d.reason, Refusal::Unidentified);
    assert!(d.message.contains("opened this connection has exited"), "{}", d.message);
    assert!(d.message.contains("live process"), "{}", d.message);
    assert_eq!(refused(&m, "gpu_fd", Refusal::Unidentified, "enforce"), 1);
}

#[test]
fn only_the_owner_removes_a_rule_and_the_refusal_names_no_other_tenant() {
    let (p, m) = policy(TenantIsolation::Enforce, 0);
    let (a, b) = (client(10, 1), client(20, 1));
    p.saw(a.tenant.as_ref().unwrap());
    assert_eq!(p.check_owner("rule_uninstall", &a, Some(10), &"f", false), Ok(()));
    let d = p.check_owner("rule_uninstall", &b, Some(10), &"10.0.0.2:1 -> 10.0.0.1:2", false).unwrap_err();
    assert_eq!((d.reason, d.code()), (Refusal::Owner, StatusCode::PermissionDenied));
    assert!(!d.message.contains("/test/10") && !d.message.contains("10 "), "names the owner: {}", d.message);
    assert!(d.message.contains("10.0.0.2:1 -> 10.0.0.1:2"), "names the flow it sent: {}", d.message);
    assert!(d.message.contains("another tenant") && d.message.contains("/test/20"), "{}", d.message);
    // A repaired flow is another tenant's connection: not named either.
    let d = p.check_owner("rule_uninstall", &b, Some(10), &"[fd00::2]:1 -> [fd00::1]:2", true).unwrap_err();
    assert!(!d.message.contains("fd00"), "names the repaired flow: {}", d.message);
    // A rule booked without a tenant (isolation was off) is anybody's.
    assert_eq!(p.check_owner("rule_uninstall", &b, None, &"f", false), Ok(()));
    assert_eq!(refused(&m, "rule_uninstall", Refusal::Owner, "enforce"), 2);
}

#[test]
fn a_flow_refusal_names_the_flow_as_sent_never_the_repaired_one() {
    let (p, _) = policy(TenantIsolation::Enforce, 0);
    let a = client(10, 1);
    let sent = FlowSpec {
        src: "[fd00::2:1:2:3:4]:40001".parse().unwrap(),
        dst: "[fd00::1:5:6:7:8]:5000".parse().unwrap(),
    };
    let theirs = FlowSpec { src: "[fd00::2]:40001".parse().unwrap(), dst: "[fd00::1]:5000".parse().unwrap() };
    let e = Examined { flow: theirs, sent, repaired: true, found: Some(Ok(Found::Exact { cgroup: 20 })) };
    let d = p.check_flow("rule_manager", &a, &e).unwrap_err();
    assert!(
        d.message.contains(&sent.src.to_string()) && d.message.contains(&sent.dst.to_string()),
        "{}",
        d.message
    );
    assert!(
        !d.message.contains(&theirs.src.to_string()) && !d.message.contains(&theirs.dst.to_string()),
        "{}",
        d.message
    );
    assert!(!d.message.contains("20"), "names the other tenant: {}", d.message);
}

#[test]
fn the_quota_counts_rules_per_tenant() {
    let (p, m) = policy(TenantIsolation::Enforce, 2);
    let a = client(10, 1);
    assert_eq!(p.take_rule("rule_manager", &a, Some(10)), Ok(()));
    assert_eq!(p.take_rule("rule_manager", &a, Some(10)), Ok(()));
    let d = p.take_rule("rule_manager", &a, Some(10)).unwrap_err();
    assert_eq!(d.code(), StatusCode::ResourceExhausted);
    assert!(d.message.contains("--max_rules_per_tenant=2"), "{}", d.message);
    // Another tenant has its own.
    assert_eq!(p.take_rule("rule_manager", &client(20, 1), Some(20)), Ok(()));
    p.give_rule(Some(10));
    assert_eq!(p.rules_held(10), 1);
    assert_eq!(p.take_rule("rule_manager", &a, Some(10)), Ok(()));
    assert_eq!(refused(&m, "rule_manager", Refusal::Quota, "enforce"), 1);
    // In audit mode the rule over the limit is served and counted.
    let (p, _) = policy(TenantIsolation::Audit, 1);
    assert_eq!(p.take_rule("rule_manager", &a, Some(10)), Ok(()));
    assert_eq!(p.take_rule("rule_manager", &a, Some(10)), Ok(()));
    assert_eq!(p.rules_held(10), 2);
}

#[test]
fn refusals_are_logged_at_most_once_a_second_per_reason() {
    let (p, _) = policy(TenantIsolation::Enforce, 0);
    let a = client(10, 0);
    for _ in 0..100 {
        let _ = p.check_gpu("gpu_fd", &a, 0, &"g");
    }
    assert_eq!(p.unlogged[Refusal::Gpu.index()].load(Ordering::Relaxed), 99);
}

#[test]
fn audit_checks_ipv4_flows_after_the_reply_and_still_counts_each() {
    let m = Arc::new(Metrics::new());
    let devices = GpuDevices { minors: vec![0], simulated: true };
    let p = Arc::new(TenantPolicy::new(TenantIsolation::Audit, 0, devices, None, Some(m.clone())));
    let v4 = FlowSpec { src: "10.0.0.2:40001".parse().unwrap(), dst: "10.0.0.1:5000".parse().unwrap() };
    let v6 = FlowSpec { src: "[fd00::2]:40001".parse().unwrap(), dst: "[fd00::1]:5000".parse().unwrap() };
    assert!(!p.checks_flow_later(&v4), "not before the thread is started");
    p.defer_flow_checks();
    assert!(p.checks_flow_later(&v4));
    assert!(!p.checks_flow_later(&v6), "IPv6 is looked up at once, to be repaired");
    // A client whose namespace is unknown: each check is a refusal, counted later.
    let a = client(10, 0b1);
    for _ in 0..3 {
        p.check_flow_later("rule_manager", &a, v4);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while refused(&m, "rule_manager", Refusal::Flow, "audit") < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(refused(&m, "rule_manager", Refusal::Flow, "audit"), 3);
    // Enforce never defers.
    let (e, _) = policy(TenantIsolation::Enforce, 0);
    let e = Arc::new(e);
    e.defer_flow_checks();
    assert!(!e.checks_flow_later(&v4));
}

#[test]
fn a_workloads_cgroups_share_its_quota_and_may_remove_each_others_rules() {
    use crate::identity::workload::Kind;
    let (p, _) = policy(TenantIsolation::Enforce, 2);
    let pod = Workload { id: 100, path: Some("/kubepods/podx".into()), kind: Kind::Pod("x".into()) };
    let container = |cgroup| {
        let mut t = Tenant::for_test(cgroup, 1);
        t.workload = pod.clone();
        Client::from(ClientInfo { tenant: Some(Arc::new(t)), ..ClientInfo::default() })
    };
    let (a, b) = (container(10), container(11));
    p.saw(a.tenant.as_ref().unwrap());
    assert_eq!(p.take_rule("rule_manager", &a, a.workload_id()), Ok(()));
    assert_eq!(p.take_rule("rule_manager", &b, b.workload_id()), Ok(()));
    let d = p.take_rule("rule_manager", &b, b.workload_id()).unwrap_err();
    assert!(d.message.contains("workload pod x holds 2 rules"), "{}", d.message);
    assert_eq!(p.rules_held(100), 2);
    assert_eq!(p.check_owner("rule_uninstall", &b, a.workload_id(), &"f", false), Ok(()));
    // Another workload: a quota of its own, and none of the Pod's rules.
    let c = client(12, 1);
    assert_eq!(p.take_rule("rule_manager", &c, c.workload_id()), Ok(()));
    let d = p.check_owner("rule_uninstall", &c, a.workload_id(), &"f", false).unwrap_err();
    assert!(d.reason == Refusal::Owner && !d.message.contains("pod x"), "{}", d.message);
}
