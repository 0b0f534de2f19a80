#!/bin/bash
# Slurm Epilog: stops this job's tcpx-rxdm (SIGTERM: rules removed, NICs and
# host tuning restored, socket folder emptied) and says what happened. It
# fails (Slurm then drains the node) only when the NICs may not be as they
# were: the daemon did not stop, stopped with an error, was killed by a
# signal, or vanished without an exit status. Settings: see common.sh.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$(readlink -f "$0")")/common.sh"

if ! tcpx_read_pid_file; then
  tcpx_log "no daemon was started for this job; nothing to stop"
  exit 0
fi
pid=$tcpx_pid

# Keeps the log for diagnosis; the rest goes.
clean_up() {
  rm -f "$TCPX_PID_FILE" "$TCPX_RC_FILE" "$TCPX_HEALTH_FILE"
  tcpx_remove_socket_dir
}

if [ ! -s "$TCPX_RC_FILE" ]; then
  if tcpx_daemon_alive; then
    kill -TERM "$pid"
    deadline=$((SECONDS + TCPX_STOP_TIMEOUT))
    until [ -s "$TCPX_RC_FILE" ]; do
      if [ "$SECONDS" -ge "$deadline" ]; then
        tcpx_log "error: the daemon (pid $pid) did not exit within ${TCPX_STOP_TIMEOUT}s of SIGTERM;" \
          "it still runs and its NICs are not restored yet (draining the node)"
        tcpx_log_tail
        exit 1
      fi
      sleep 0.05
    done
  else
    # Gone before we looked; its waiting shell writes the status right after.
    for _ in $(seq 20); do
      [ -s "$TCPX_RC_FILE" ] && break
      sleep 0.1
    done
    if [ ! -s "$TCPX_RC_FILE" ]; then
      if [ -e "/proc/$pid" ]; then
        what="pid $pid is now another process, not our daemon"
      else
        what="the daemon (pid $pid) is gone"
      fi
      tcpx_log "error: $what, and it left no exit status (the shell that waited on it was killed too);" \
        "sent no signal. Whether its NICs were restored is unknown (draining the node): check them and resume it"
      tcpx_log_tail
      clean_up
      exit 1
    fi
    tcpx_log "the daemon (pid $pid) had already exited; sent no signal"
  fi
fi

rc=$(cat "$TCPX_RC_FILE")
case $rc in
  0)
    tcpx_log "stopped cleanly (exit 0: rules removed, NICs restored) in $(tcpx_ms) ms"
    clean_up
    rm -f "$TCPX_LOG_FILE"
    exit 0
    ;;
  1)
    tcpx_log "error: the daemon exited with status 1: a restore step failed, or a NIC failed while it served" \
      "(the NICs may not be as they were: draining the node; the log says which)"
    ;;
  2)
    tcpx_log "error: the daemon exited with status 2: it rejected its flags or topology (draining the node; see the log)"
    ;;
  *)
    if [[ $rc =~ ^[0-9]+$ ]] && [ "$rc" -gt 128 ]; then
      sig=$((rc - 128))
      name=$(kill -l "$sig" 2>/dev/null || echo "?")
      tcpx_log "error: the daemon was killed by signal $sig (SIG$name): it could not restore its NICs," \
        "so draining the node is right; check or reset the NICs (or reboot), then resume the node"
    else
      tcpx_log "error: the daemon exited with status $rc (draining the node; see the log)"
    fi
    ;;
esac
tcpx_log_tail
clean_up
exit 1
