#!/usr/bin/env bash
# Holds IDLE connections open to the daemon's HTTP port without sending a
# byte, then GETs PATH (default /healthz) PROBES times, one after another, as
# a kubelet's probes would arrive during such a flood. Prints how many were
# answered 200 and exits 0 only if all were. Bash alone (no curl, no python),
# so that it runs inside the image as well as against a daemon on this host:
#   .ci/lib/idle_flood.sh HOST PORT [IDLE] [PROBES] [PATH]
#   docker exec -i NAME bash -s -- 127.0.0.1 9467 < .ci/lib/idle_flood.sh
set -uo pipefail
host=${1:?host} port=${2:?port} idle=${3:-80} probes=${4:-12} path=${5:-/healthz}

# A probe the daemon has already refused and closed must not end this script.
trap '' PIPE
held=()
for ((i = 0; i < idle; i++)); do
  if ! exec {fd}<>"/dev/tcp/$host/$port"; then
    echo "could not open idle connection $((i + 1)) of $idle to $host:$port"
    exit 2
  fi
  held+=("$fd")
done

ok=0 codes=()
for ((i = 0; i < probes; i++)); do
  code=none
  if exec {p}<>"/dev/tcp/$host/$port"; then
    printf 'GET %s HTTP/1.1\r\nHost: %s\r\n\r\n' "$path" "$host" 1>&"$p" 2>/dev/null
    # read -t guards against a hang only: a closed connection ends the read at once.
    if IFS=' ' read -r -t 10 _ code _ <&"$p"; then
      [ "$code" = 200 ] && ok=$((ok + 1))
    else
      code=closed
    fi
    exec {p}>&-
  fi
  codes+=("$code")
done
for fd in "${held[@]}"; do exec {fd}>&-; done

echo "$path under $idle idle connections: $ok of $probes answered 200 (${codes[*]})"
[ "$ok" = "$probes" ]
