"""deploy-lint's check of DaemonSets whose rolling update could never start.

  surge-ports.py FILE...     exit 1 naming each DaemonSet of the FILEs (a
                             List's items too) that is on the host network,
                             surges (maxSurge other than 0) and has a
                             container asking for a host port
  surge-ports.py --self-test the check refuses a bad DaemonSet and passes
                             good ones (so that it cannot pass by reading
                             nothing)

On the host network every containerPort is also a hostPort, and the
scheduler places no Pod on a node where another Pod holds the same host
port: the surge Pod would stay Pending beside the old one. tests/deploy_files.rs
runs the same check in cargo test.
"""
import sys

import yaml


def daemonsets(paths):
    for p in paths:
        with open(p) as f:
            for d in yaml.safe_load_all(f):
                if not isinstance(d, dict):
                    continue
                items = d.get("items", []) if d.get("kind") == "List" else [d]
                for i in items:
                    if isinstance(i, dict) and i.get("kind") == "DaemonSet":
                        yield p, i


def surges(ds):
    strategy = (ds.get("spec") or {}).get("updateStrategy") or {}
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return False
    surge = (strategy.get("rollingUpdate") or {}).get("maxSurge")
    # Absent, 0 and "0%" are no surge (the default is 0).
    return surge is not None and str(surge).rstrip("%") != "0"


def problem(ds):
    pod = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    if pod.get("hostNetwork") is not True or not surges(ds):
        return None
    ports = []
    for c in (pod.get("containers") or []) + (pod.get("initContainers") or []):
        for p in c.get("ports") or []:
            port = p.get("hostPort", p.get("containerPort"))
            if port is not None:
                ports.append(f"{c.get('name')} port {port}")
    if not ports:
        return None
    name = (ds.get("metadata") or {}).get("name")
    surge = ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"]
    return (f"DaemonSet {name}: hostNetwork with maxSurge {surge}, and {', '.join(ports)} (a host port "
            "on the host network): the surge Pod can never be placed beside the old one; declare no port")


def check(paths):
    bad = n = 0
    for path, ds in daemonsets(paths):
        n += 1
        why = problem(ds)
        if why:
            print(f"{path}: {why}", file=sys.stderr)
            bad += 1
    print(f"{n} DaemonSets, {bad} whose rollout a host port would block")
    return 1 if bad else 0


def self_test():
    def ds(surge, host_network=True, kind="RollingUpdate", ports=({"containerPort": 9467},), init=()):
        return {"kind": "DaemonSet", "metadata": {"name": "d"},
                "spec": {"updateStrategy": {"type": kind, "rollingUpdate": {"maxSurge": surge}},
                         "template": {"spec": {"hostNetwork": host_network,
                                               "containers": [{"name": "c", "ports": list(ports)}],
                                               "initContainers": [{"name": "i", "ports": list(init)}]}}}}
    bad = [ds(1), ds("25%"), ds(1, ports=({"hostPort": 80},)), ds(1, ports=(), init=({"containerPort": 1},))]
    good = [ds(0), ds("0%"), ds(None), ds(1, host_network=False), ds(1, kind="OnDelete"), ds(1, ports=())]
    for d in bad:
        assert problem(d), f"passed: {d}"
    for d in good:
        assert problem(d) is None, f"refused: {d}"
    print(f"surge-ports self-test: {len(bad)} refused, {len(good)} passed, as they should")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    else:
        sys.exit(check(sys.argv[1:]))
