#!/bin/bash
# Slurm Prolog: starts one tcpx-rxdm for this job with its own socket folder
# (/run/tcpx-$SLURM_JOB_ID) and returns once the daemon serves, or fails
# with the reason (so Slurm does not start the job on a node without it).
# Pair with epilog.sh; settings are in common.sh.
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
  tcpx_log "error: $TCPX_RXDM_BIN is not an executable (set TCPX_RXDM_BIN)"
  exit 1
fi
mkdir -p "$TCPX_STATE_DIR"
if [ -f "$TCPX_PID_FILE" ] && kill -0 "$(cat "$TCPX_PID_FILE")" 2>/dev/null; then
  tcpx_log "error: a daemon for this job already runs (pid $(cat "$TCPX_PID_FILE"))"
  exit 1
fi
rm -f "$TCPX_PID_FILE" "$TCPX_RC_FILE" "$TCPX_HEALTH_FILE" "$TCPX_LOG_FILE"
# The socket folder, reachable by the job's group before the first socket appears.
if [ -n "$TCPX_SOCKET_GROUP" ]; then
  install -d -m 0770 -g "$TCPX_SOCKET_GROUP" "$TCPX_UDS_PATH"
fi

# Detached from the prolog; a small shell waits on the daemon to keep its exit
# status for the epilog.
# shellcheck disable=SC2016 # expanded by the inner shell
HEALTH_CHECK_LOG_FILE=$TCPX_HEALTH_FILE TCPX_PID_FILE=$TCPX_PID_FILE TCPX_RC_FILE=$TCPX_RC_FILE \
  setsid bash -c '"$@" & echo $! > "$TCPX_PID_FILE"; wait $!; echo $? > "$TCPX_RC_FILE"' \
  tcpx-rxdm-job "${args[@]}" </dev/null >>"$TCPX_LOG_FILE" 2>&1 &

# Ready when the daemon writes the ready line to the health file (no fixed
# sleep); fail early if it exits.
deadline=$((SECONDS + TCPX_READY_TIMEOUT))
while :; do
  if grep -qsF "$TCPX_READY_LINE" "$TCPX_HEALTH_FILE"; then
    tcpx_log "ready on $TCPX_UDS_PATH (pid $(cat "$TCPX_PID_FILE" 2>/dev/null))"
    exit 0
  fi
  if [ -s "$TCPX_RC_FILE" ]; then
    tcpx_log "error: the daemon exited with status $(cat "$TCPX_RC_FILE") before it was ready"
    tcpx_log_tail
    # It undid its own changes on the way out: nothing for the epilog to stop.
    rm -f "$TCPX_PID_FILE" "$TCPX_RC_FILE" "$TCPX_HEALTH_FILE"
    exit 1
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    tcpx_log "error: the daemon was not ready after ${TCPX_READY_TIMEOUT}s; stopping it"
    if [ -s "$TCPX_PID_FILE" ]; then kill -TERM "$(cat "$TCPX_PID_FILE")" 2>/dev/null || true; fi
    tcpx_log_tail
    exit 1
  fi
  sleep 0.2
done
