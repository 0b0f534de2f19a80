#!/bin/bash
# Slurm Epilog: stops this job's tcpx-rxdm (SIGTERM: rules removed, NICs and
# host tuning restored, socket folder emptied) and checks that it exited 0.
# A non-zero exit here makes Slurm drain the node: the NICs may not be as
# they were. Settings are in common.sh.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$(readlink -f "$0")")/common.sh"

if [ ! -s "$TCPX_PID_FILE" ]; then
  tcpx_log "no daemon was started for this job; nothing to stop"
  exit 0
fi
pid=$(cat "$TCPX_PID_FILE")

if [ ! -s "$TCPX_RC_FILE" ]; then
  # Only signal the process if it still is our daemon (pids get reused).
  if grep -qsF -- "--uds_path=$TCPX_UDS_PATH" "/proc/$pid/cmdline"; then
    kill -TERM "$pid"
  fi
  deadline=$((SECONDS + TCPX_STOP_TIMEOUT))
  until [ -s "$TCPX_RC_FILE" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      tcpx_log "error: the daemon (pid $pid) did not exit within ${TCPX_STOP_TIMEOUT}s of SIGTERM"
      tcpx_log_tail
      exit 1
    fi
    sleep 0.2
  done
fi

rc=$(cat "$TCPX_RC_FILE")
if [ "$rc" != 0 ]; then
  tcpx_log "error: the daemon exited with status $rc (1: a restore step failed or a NIC failed; see the log)"
  tcpx_log_tail
  exit 1
fi
tcpx_log "stopped cleanly"
rm -f "$TCPX_PID_FILE" "$TCPX_RC_FILE" "$TCPX_HEALTH_FILE" "$TCPX_LOG_FILE"
rmdir "$TCPX_UDS_PATH" 2>/dev/null || true
exit 0
