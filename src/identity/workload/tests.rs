//! The workload rule over the cgroup paths of each layout.

use super::*;

/// The workload's part of `path` under the layouts, and its name.
fn of(path: &str) -> (&str, String) {
    let (part, kind) = part(path, Rule::Layouts);
    let w = Workload { id: 1, path: Some(part.to_string()), kind };
    (part, w.name())
}

const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const UID_: &str = "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0";

#[test]
fn a_pod_under_the_systemd_driver_is_its_slice_whatever_its_qos() {
    for qos in
        ["kubepods-burstable.slice/kubepods-burstable", "kubepods-besteffort.slice/kubepods-besteffort"]
    {
        let pod = format!("/kubepods.slice/{qos}-pod{UID_}.slice");
        for below in
            ["/cri-containerd-ab12.scope", "/crio-cd34.scope", "/cri-containerd-ab12.scope/made/by/it", ""]
        {
            assert_eq!(of(&format!("{pod}{below}")), (pod.as_str(), format!("pod {UID}")), "{below}");
        }
    }
    // Guaranteed: right under kubepods.slice.
    let pod = format!("/kubepods.slice/kubepods-pod{UID_}.slice");
    assert_eq!(of(&format!("{pod}/cri-containerd-ef56.scope")), (pod.as_str(), format!("pod {UID}")));
    // A kubelet with a cgroup root of its own (kind: `kubelet.slice`), and a
    // daemon in a cgroup namespace of its own: the ancestors it cannot see.
    let pod = format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice");
    assert_eq!(of(&format!("{pod}/cri-containerd-1.scope")).1, format!("pod {UID}"));
    let pod = format!("/../../kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice");
    assert_eq!(of(&format!("{pod}/cri-containerd-1.scope")), (pod.as_str(), format!("pod {UID}")));
}

#[test]
fn a_pod_under_the_cgroupfs_driver_is_its_cgroup_whatever_its_qos() {
    for qos in ["/kubepods/burstable", "/kubepods/besteffort", "/kubepods", "/kubelet/kubepods/besteffort"] {
        let pod = format!("{qos}/pod{UID}");
        for below in ["/4f6a0c1d2e3b", "/4f6a0c1d2e3b/sub", ""] {
            assert_eq!(of(&format!("{pod}{below}")), (pod.as_str(), format!("pod {UID}")), "{qos}{below}");
        }
    }
    // `pod…` anywhere else is no Pod.
    assert_eq!(of("/docker/pod123/x").1, "/docker/pod123/x");
    assert_eq!(of("/kubepods/burstable").1, "/kubepods/burstable");
}

#[test]
fn a_slurm_job_is_its_job_cgroup_with_every_step_user_and_task() {
    for below in ["/step_0/user/task_0", "/step_batch/user/task_1", "/step_extern/slurm", "/step_2", ""] {
        let path = format!("/system.slice/slurmstepd.scope/job_42{below}");
        assert_eq!(of(&path), ("/system.slice/slurmstepd.scope/job_42", "slurm job 42".into()), "{below}");
    }
    // Several slurmd on one node: `<node>_slurmstepd.scope`.
    assert_eq!(of("/system.slice/n1_slurmstepd.scope/job_7/step_0/user/task_0").1, "slurm job 7");
    // slurmstepd's own processes: its scope.
    assert_eq!(of("/system.slice/slurmstepd.scope/system").1, "slurmstepd.scope");
    // A job's cgroup outside a unit, and the outermost job where the job made more.
    assert_eq!(of("/slurm/job_9/step_0").1, "slurm job 9");
    assert_eq!(of("/system.slice/slurmstepd.scope/job_42/step_0/user/job_43/step_1").1, "slurm job 42");
    assert_eq!(of("/x/job_/y").1, "/x/job_/y");
    assert_eq!(of("/x/job_4a").1, "/x/job_4a");
}

#[test]
fn else_the_outermost_service_or_scope() {
    assert_eq!(of("/system.slice/foo.service"), ("/system.slice/foo.service", "foo.service".into()));
    assert_eq!(of("/system.slice/foo.service/worker/1"), ("/system.slice/foo.service", "foo.service".into()));
    assert_eq!(of("/system.slice/docker-4f6a.scope").1, "docker-4f6a.scope");
    assert_eq!(of("/user.slice/user-1000.slice/session-3.scope").1, "session-3.scope");
    // A user's service manager is one workload, whatever units it starts.
    let user = "/user.slice/user-1000.slice/user@1000.service";
    assert_eq!(of(&format!("{user}/app.slice/a.service")), (user, "user@1000.service".into()));
    assert_eq!(of(&format!("{user}/app.slice/b.scope")), (user, "user@1000.service".into()));
}

#[test]
fn nothing_made_below_a_workload_makes_a_workload_of_its_own() {
    let user = "/user.slice/user-1000.slice/user@1000.service";
    for made in [
        format!("/app.slice/kubepods-pod{UID_}.slice/x"),
        format!("/kubepods/pod{UID}/x"),
        "/job_5/step_0".to_string(),
        "/slurmstepd.scope/job_5".to_string(),
    ] {
        assert_eq!(of(&format!("{user}{made}")).0, user, "{made}");
    }
    let pod = format!("/kubepods.slice/kubepods-pod{UID_}.slice");
    assert_eq!(of(&format!("{pod}/c.scope/kubepods-pod1234.slice/d")).0, pod);
    assert_eq!(of(&format!("{pod}/c.scope/job_3")).0, pod);
}

#[test]
fn else_the_processs_own_cgroup() {
    for path in
        ["/", "/tcpx-test-1-a", "/a/b/c", "/kubepods.slice", "/user.slice/user-1000.slice", "/../../x"]
    {
        assert_eq!(of(path), (path, path.to_string()));
    }
}

#[test]
fn workload_cgroup_depth_takes_the_first_levels() {
    let depth = |n| Rule::from_depth(n);
    assert_eq!(depth(0), Rule::Layouts);
    assert_eq!(part("/a/b/c/d", depth(2)), ("/a/b", Kind::Levels));
    assert_eq!(part("/a/b", depth(2)), ("/a/b", Kind::Levels));
    assert_eq!(part("/a/b/c", depth(1)), ("/a", Kind::Levels));
    // Higher up than the workloads: its own.
    assert_eq!(part("/a", depth(2)), ("/a", Kind::Cgroup));
    assert_eq!(part("/", depth(1)), ("/", Kind::Cgroup));
    // The layouts are not looked at.
    let pod = format!("/kubepods.slice/kubepods-pod{UID_}.slice/c.scope");
    assert_eq!(part(&pod, depth(1)), ("/kubepods.slice", Kind::Levels));
    // Outside the daemon's cgroup namespace the levels cannot be counted.
    assert_eq!(part("/../a/b/c", depth(1)), ("/../a/b/c", Kind::Cgroup));
}

#[test]
fn the_id_is_the_workloads_cgroup_folder_else_a_number_from_its_path() {
    let root = tempfile::tempdir().unwrap();
    let job = "/system.slice/slurmstepd.scope/job_42";
    let task = format!("{job}/step_0/user/task_0");
    std::fs::create_dir_all(root.path().join(&task[1..])).unwrap();
    let ino = |p: &str| std::fs::metadata(root.path().join(&p[1..])).unwrap().ino();
    let (job_id, task_id) = (ino(job), ino(&task));
    let w = resolve(task_id, Some(&task), Rule::Layouts, Some(root.path()));
    assert_eq!((w.id, w.path.as_deref(), w.name()), (job_id, Some(job), "slurm job 42".to_string()));
    assert!(is_cgroup_id(w.id));
    // A folder that is not the process's cgroup: the mount does not show
    // its paths, so the path names the workload.
    let w = resolve(task_id + 1, Some(&task), Rule::Layouts, Some(root.path()));
    assert_eq!(w.id, path_id(job));
    assert!(!is_cgroup_id(w.id));
    let w = resolve(task_id, Some(&format!("/..{task}")), Rule::Layouts, Some(root.path()));
    assert_eq!(w.id, path_id(&format!("/..{job}")));
    let w = resolve(task_id, Some(&task), Rule::Layouts, None);
    assert_eq!(w.id, path_id(job));
    // Its own cgroup, or no path: the process's cgroup id.
    assert_eq!(resolve(9, Some("/a/b"), Rule::Layouts, None), Workload::cgroup(9, Some("/a/b".into())));
    assert_eq!(resolve(9, None, Rule::Layouts, None).name(), "cgroup id 9");
    assert_ne!(path_id("/a"), path_id("/b"));
}

#[test]
fn cgroup2_mount_is_found_in_a_hybrid_layout() {
    let mounts = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
    assert_eq!(cgroup2_mount(mounts), Some("/sys/fs/cgroup/unified".into()));
    assert_eq!(cgroup2_mount("proc /proc proc rw 0 0\n"), None);
}
