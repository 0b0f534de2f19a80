# shellcheck shell=bash
# What a CI script does when it cannot run here (not root, no engine, a
# package that cannot be had): outside CI it says SKIPPED and why, and exits
# 0, so that a developer's machine without docker can run the rest; with CI
# set (.ci/run sets it), nothing may pass by skipping: it says FAIL, exit 1.
#   skip_or_fail "what cannot run and why"
skip_or_fail() {
  case "${CI:-}" in
    "" | 0 | false | no)
      echo "SKIPPED: $1"
      exit 0
      ;;
    *)
      echo "FAIL: $1 (CI is set: a check that cannot run fails the run instead of being skipped)"
      exit 1
      ;;
  esac
}
