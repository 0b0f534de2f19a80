"""Helpers for .ci/deploy-lint's checks of `tcpx-rxdm inject` output.

  split OUTDIR FILE...   every document of the FILEs (a List's items one by
                         one) into OUTDIR/NNN.yaml, for kubernetes-validate,
                         which has no schema for List; JobSets left out (the
                         jobset check below has their schema)
  jobset CRD FILE...     every JobSet document of the FILEs against the CRD's
                         openAPIV3Schema, unknown fields refused (as the API
                         server's structural pruning would drop them); a
                         JobSet with one unknown field added must fail
"""
import copy
import sys

import jsonschema
import yaml


def docs(paths):
    for p in paths:
        with open(p) as f:
            for d in yaml.safe_load_all(f):
                if d is None:
                    continue
                if d.get("kind") == "List":
                    yield from d.get("items", [])
                else:
                    yield d


def split(outdir, paths):
    n = 0
    for d in docs(paths):
        if str(d.get("apiVersion", "")).startswith("jobset.x-k8s.io/"):
            continue
        with open(f"{outdir}/{n:03}.yaml", "w") as f:
            yaml.safe_dump(d, f)
        n += 1
    print(f"{n} documents")


def strict(schema):
    """Objects with listed properties take no others, unless the schema says so."""
    if isinstance(schema, dict):
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
        for v in schema.values():
            strict(v)
    elif isinstance(schema, list):
        for v in schema:
            strict(v)
    return schema


def jobset(crd_path, paths):
    with open(crd_path) as f:
        crd = yaml.safe_load(f)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2")
    schema = strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    validator = jsonschema.Draft7Validator(schema)
    checked = 0
    for d in docs(paths):
        if d.get("kind") != "JobSet":
            continue
        errors = sorted(validator.iter_errors(d), key=str)
        for e in errors:
            print(f"JobSet/{d['metadata']['name']}: {'.'.join(map(str, e.absolute_path))}: {e.message}")
        if errors:
            sys.exit(1)
        bad = copy.deepcopy(d)
        bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["bogus"] = 1
        if validator.is_valid(bad):
            print("the JobSet check accepts an unknown field: it checks nothing")
            sys.exit(1)
        checked += 1
    if checked == 0:
        print("no JobSet found")
        sys.exit(1)
    print(f"{checked} JobSet documents valid against {crd_path}")


if __name__ == "__main__":
    cmd, first, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    {"split": split, "jobset": jobset}[cmd](first, rest)
