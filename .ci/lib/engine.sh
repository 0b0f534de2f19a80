# shellcheck shell=bash
# A private Docker engine for CI scripts (source this file; needs root).
#
#   engine_start                 install docker.io and debootstrap if missing,
#                                start dockerd on a private socket, export
#                                DOCKER_HOST and DOCKER (the client to call).
#                                Non-zero with a one-line reason on stderr when
#                                no engine can run here: print "SKIPPED: ..."
#   engine_stop                  stop that dockerd by pid and clean up its
#                                mounts; idempotent, safe from an EXIT trap
#   engine_rootfs_image TAG [PKGS]
#                                a local Debian bookworm image (debootstrap
#                                --variant=minbase, PKGS comma-separated extra
#                                packages) imported as TAG; reused if TAG exists
#
# Everything lives under ENGINE_DIR (default /tmp/tcpx-ci-engine): data root,
# exec root, pidfile, socket, daemon log. The data root is kept after
# engine_stop, so a later run on the same machine reuses its images. The
# daemon runs with --iptables=false --bridge=none: containers and builds use
# --network host (or none); nothing touches the host's firewall or bridges.

ENGINE_DIR=${ENGINE_DIR:-/tmp/tcpx-ci-engine}
_ENGINE_PID=

_engine_apt_install() {
  # DPkg::Lock::Timeout: wait for another apt/dpkg instead of failing.
  local apt=(apt-get -o DPkg::Lock::Timeout=600 -qq)
  local policy_added=
  # No init script may start a second, default daemon during the install.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && policy_added=1
  fi
  local rc=0 i
  # apt-get update takes the lists lock, which the timeout above may not cover.
  for ((i = 0; i < 600; i++)); do
    command -v fuser >/dev/null 2>&1 || break
    fuser /var/lib/dpkg/lock-frontend /var/lib/apt/lists/lock >/dev/null 2>&1 || break
    sleep 1
  done
  { "${apt[@]}" update && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends "$@"; } \
    >"$ENGINE_DIR/apt.log" 2>&1 || rc=$?
  [ -z "$policy_added" ] || rm -f /usr/sbin/policy-rc.d
  return "$rc"
}

engine_start() {
  if [ "$(id -u)" != 0 ]; then
    echo "engine: needs root to run dockerd" >&2
    return 1
  fi
  mkdir -p "$ENGINE_DIR" || { echo "engine: cannot create $ENGINE_DIR" >&2; return 1; }
  local missing=()
  # Debian's docker.io: /usr/sbin/dockerd and its matching client /usr/bin/docker.
  if [ ! -x /usr/sbin/dockerd ] || [ ! -x /usr/bin/docker ]; then missing+=(docker.io); fi
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    if ! _engine_apt_install "${missing[@]}"; then
      echo "engine: apt-get install ${missing[*]} failed: $(tail -n 1 "$ENGINE_DIR/apt.log")" >&2
      return 1
    fi
  fi

  local pidfile=$ENGINE_DIR/dockerd.pid sock=$ENGINE_DIR/docker.sock
  if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "engine: a dockerd (pid $(cat "$pidfile")) already uses $ENGINE_DIR; set ENGINE_DIR to another folder" >&2
    return 1
  fi
  rm -f "$pidfile" "$sock"
  /usr/sbin/dockerd --iptables=false --bridge=none \
    --data-root "$ENGINE_DIR/data" --exec-root "$ENGINE_DIR/exec" \
    --pidfile "$pidfile" --host "unix://$sock" \
    >"$ENGINE_DIR/dockerd.log" 2>&1 </dev/null &
  _ENGINE_PID=$!
  export DOCKER_HOST="unix://$sock"
  # Debian's client matches Debian's 20.10 daemon; a newer client elsewhere on
  # PATH may refuse to talk to it.
  export DOCKER=/usr/bin/docker

  local i
  for ((i = 0; i < 120; i++)); do
    if ! kill -0 "$_ENGINE_PID" 2>/dev/null; then
      _ENGINE_PID=
      echo "engine: dockerd exited: $(grep -v '^$' "$ENGINE_DIR/dockerd.log" | tail -n 1)" >&2
      return 1
    fi
    if "$DOCKER" version >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.5
  done
  echo "engine: dockerd did not answer on $sock within 60 s (log: $ENGINE_DIR/dockerd.log)" >&2
  engine_stop
  return 1
}

engine_stop() {
  local pid=$_ENGINE_PID i
  _ENGINE_PID=
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    # dockerd stops its containers (up to 15 s each by default), then containerd.
    for ((i = 0; i < 300; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
    fi
  fi
  # Mounts it may leave behind (overlay layers, netns files, shm), deepest first.
  local m
  if [ -r /proc/self/mountinfo ]; then
    while read -r m; do
      umount -l "$m" 2>/dev/null || true
    done < <(awk -v d="$ENGINE_DIR/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
  fi
  rm -f "$ENGINE_DIR/docker.sock" "$ENGINE_DIR/dockerd.pid"
  return 0
}

# The host's Debian mirror for bookworm (what its apt uses), else deb.debian.org.
_engine_mirror() {
  local uri
  # shellcheck disable=SC2016 # apt's own $(FIELD) syntax, not the shell's
  uri=$(apt-get indextargets --no-release-info --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' 2>/dev/null |
    awk '$2 == "bookworm" { print $1; exit }')
  echo "${uri:-http://deb.debian.org/debian/}"
}

engine_rootfs_image() {
  local tag=$1 extra=${2:-}
  [ -n "$tag" ] || { echo "engine_rootfs_image: TAG missing" >&2; return 1; }
  if "$DOCKER" image inspect "$tag" >/dev/null 2>&1; then
    return 0
  fi
  local dir log mirror rc=0
  dir=$(mktemp -d "$ENGINE_DIR/rootfs.XXXXXX") || return 1
  log=$dir.log
  mirror=$(_engine_mirror)
  debootstrap --variant=minbase ${extra:+"--include=$extra"} bookworm "$dir" "$mirror" >"$log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*_Packages
    tar --numeric-owner -C "$dir" -c . | "$DOCKER" import --change 'CMD ["/bin/bash"]' - "$tag" >>"$log" 2>&1 || rc=$?
  fi
  # debootstrap unmounts /proc and /sys on success, not always on failure.
  local m
  while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done < <(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
  rm -rf "$dir"
  if [ "$rc" != 0 ]; then
    echo "engine_rootfs_image $tag: failed (exit $rc): $(tail -n 1 "$log")" >&2
    return 1
  fi
  rm -f "$log"
  return 0
}
