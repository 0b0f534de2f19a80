#!/bin/bash
# Slurm Prolog: starts one tcpx-rxdm for this job with its own socket folder
# (/run/tcpx-$SLURM_JOB_ID) and returns once the daemon serves, or fails
# with the reason (so Slurm does not start the job on a node without it).
# Pair with epilog.sh; settings in /etc/tcpx-rxdm/slurm.conf (see common.sh).
#
# One daemon per job manages all of the node's GPU NICs: nodes must be
# allocated whole (exclusive). On shared nodes run the node-wide systemd unit.
#
# slurm.conf:  Prolog=/etc/slurm/tcpx/prolog.sh  Epilog=/etc/slurm/tcpx/epilog.sh  PrologFlags=Alloc
#              TaskProlog=/etc/slurm/tcpx/task-prolog.sh
# TCPX_PRINT_ARGS=1 prints the daemon's command line, one word a line, and exits.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$(readlink -f "$0")")/common.sh"

args=(
  "$TCPX_RXDM_BIN"
  "--gpu_nic_preset=$TCPX_PRESET"
  "--uds_path=$TCPX_UDS_PATH"
  "--metrics_address=$TCPX_HTTP"
  # The job may run several steps: stay up until the epilog stops us.
  --nomonitor_shutdown
  # The job's own daemon serves only the job (nodes are exclusive): one
  # tenant, nothing to keep apart. TCPX_EXTRA_ARGS may say otherwise.
  --tenant_isolation=off
)
if [ -n "$TCPX_SOCKET_GROUP" ]; then
  args+=("--socket_group=$TCPX_SOCKET_GROUP")
fi
# shellcheck disable=SC2206 # split on purpose
args+=($TCPX_EXTRA_ARGS)

if [ "${TCPX_PRINT_ARGS:-0}" = 1 ]; then
  printf '%s\n' "${args[@]}"
  exit 0
fi

if [ ! -x "$TCPX_RXDM_BIN" ]; then
  tcpx_log "error: $TCPX_RXDM_BIN is not an executable (set TCPX_RXDM_BIN in $TCPX_SLURM_CONF)"
  exit 1
fi
mkdir -p "$TCPX_STATE_DIR"
if tcpx_daemon_alive; then
  tcpx_log "error: a daemon for this job already runs (pid $tcpx_pid)"
  exit 1
fi
rm -f "$TCPX_PID_FILE" "$TCPX_RC_FILE" "$TCPX_HEALTH_FILE" "$TCPX_LOG_FILE"

# A failed start leaves nothing behind but the log.
created_dir=0
[ -e "$TCPX_UDS_PATH" ] || created_dir=1
give_up() {
  rm -f "$TCPX_PID_FILE" "$TCPX_RC_FILE" "$TCPX_HEALTH_FILE"
  if [ "$created_dir" = 1 ]; then tcpx_remove_socket_dir; fi
  tcpx_log "gave up after $(tcpx_ms) ms; the daemon's log stays in $TCPX_LOG_FILE"
  exit 1
}

# The socket folder, reachable by the job's group before the first socket appears.
if [ -n "$TCPX_SOCKET_GROUP" ]; then
  install -d -m 0770 -g "$TCPX_SOCKET_GROUP" "$TCPX_UDS_PATH"
fi

# Detached from the prolog, in a session of its own: a small shell closes
# every inherited descriptor above 2 (a site wrapper's pipes would otherwise
# keep slurmd waiting until PrologEpilogTimeout), starts the daemon, writes
# "PID STARTTIME", waits, and keeps the exit status (128+N: signal N) for the
# epilog.
# shellcheck disable=SC2016 # expanded by the inner shell
HEALTH_CHECK_LOG_FILE=$TCPX_HEALTH_FILE TCPX_PID_FILE=$TCPX_PID_FILE TCPX_RC_FILE=$TCPX_RC_FILE \
  setsid bash -c '
    for fd in /proc/$$/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ] 2>/dev/null; then exec {fd}>&-; fi
    done
    "$@" &
    pid=$!
    stat=$(cat /proc/$pid/stat) && set -- ${stat##*) } && echo "$pid ${20}" > "$TCPX_PID_FILE.new" &&
      mv "$TCPX_PID_FILE.new" "$TCPX_PID_FILE"
    wait $pid
    echo $? > "$TCPX_RC_FILE"' \
  tcpx-rxdm-job "${args[@]}" </dev/null >>"$TCPX_LOG_FILE" 2>&1 &

# The job whose daemon holds a NIC the new daemon needed, if it is one of ours.
holder_job() {
  local f pid _
  for f in "$TCPX_STATE_DIR"/*.pid; do
    [ -s "$f" ] || continue
    read -r pid _ <"$f" || true
    if [ "$pid" = "$1" ]; then basename "$f" .pid; return 0; fi
  done
  return 1
}

# Ready when the daemon writes the ready line to the health file (no fixed
# sleep); fail early if it exits.
deadline=$((SECONDS + TCPX_READY_TIMEOUT))
while :; do
  if grep -qsF "$TCPX_READY_LINE" "$TCPX_HEALTH_FILE"; then
    tcpx_read_pid_file || true
    http=$(sed -n 's/.*HTTP endpoints listening.*address=\([^ ]*\).*/\1/p' "$TCPX_LOG_FILE" | head -n 1)
    tcpx_log "ready on $TCPX_UDS_PATH (pid ${tcpx_pid:-?}${http:+, HTTP on $http}) after $(tcpx_ms) ms"
    exit 0
  fi
  if [ -s "$TCPX_RC_FILE" ]; then
    rc=$(cat "$TCPX_RC_FILE")
    held=$(sed -n 's/.*NIC \([^ ]*\) is already managed by another tcpx-rxdm (pid \([0-9]*\)).*/\1 \2/p' "$TCPX_LOG_FILE" | head -n 1)
    if [ -n "$held" ]; then
      read -r nic pid <<<"$held"
      if job=$(holder_job "$pid"); then
        who="job $job's daemon (pid $pid)"
      else
        who="a tcpx-rxdm not started by this prolog (pid $pid; the node-wide systemd unit?)"
      fi
      tcpx_log "error: NIC $nic is already managed by $who. One daemon per job needs the whole node:" \
        "allocate nodes exclusively (sbatch --exclusive, or OverSubscribe=EXCLUSIVE on the partition)," \
        "or run the node-wide systemd unit (tcpx-rxdm.service) instead of this prolog and epilog"
      give_up
    fi
    tcpx_log "error: the daemon exited with status $rc before it was ready"
    tcpx_log_tail
    # It undid its own changes on the way out: nothing for the epilog to stop.
    give_up
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    tcpx_log "error: the daemon was not ready after ${TCPX_READY_TIMEOUT}s; stopping it"
    tcpx_log_tail
    if tcpx_daemon_alive; then
      kill -TERM "$tcpx_pid" 2>/dev/null || true
      stop=$((SECONDS + TCPX_STOP_TIMEOUT))
      until [ -s "$TCPX_RC_FILE" ] || [ "$SECONDS" -ge "$stop" ]; do sleep 0.2; done
      if [ ! -s "$TCPX_RC_FILE" ]; then
        # Still running: keep its pid file for the epilog.
        tcpx_log "error: it did not exit within ${TCPX_STOP_TIMEOUT}s of SIGTERM (pid $tcpx_pid)"
        exit 1
      fi
      tcpx_log "it stopped with status $(cat "$TCPX_RC_FILE")"
    fi
    give_up
  fi
  sleep 0.1
done
