# shellcheck shell=bash disable=SC2034
# Shared settings of prolog.sh and epilog.sh (sourced, not run). Every
# setting can be overridden from the environment (slurmd's, or a wrapper that
# exports them and runs the script). Keep slurm.conf's PrologEpilogTimeout
# above TCPX_READY_TIMEOUT and TCPX_STOP_TIMEOUT.

: "${SLURM_JOB_ID:?SLURM_JOB_ID is not set: run this as a Slurm prolog/epilog}"

# The daemon binary.
TCPX_RXDM_BIN=${TCPX_RXDM_BIN:-/usr/local/bin/tcpx-rxdm}
# The job's socket folder; the job sets NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX
# to the same path (task-prolog.sh does that).
TCPX_UDS_PATH=${TCPX_UDS_PATH:-/run/tcpx-$SLURM_JOB_ID}
# pid, exit-status, health and log files of the per-job daemons.
TCPX_STATE_DIR=${TCPX_STATE_DIR:-/run/tcpx-rxdm-slurm}
# HTTP endpoints (/metrics, /readyz, /debug/flows); empty disables them.
TCPX_HTTP=${TCPX_HTTP-0.0.0.0:9467}
# GPU/NIC preset: auto (discovery), a3vm, ...
TCPX_PRESET=${TCPX_PRESET:-auto}
# Seconds to wait for the ready line, and for the daemon to exit.
TCPX_READY_TIMEOUT=${TCPX_READY_TIMEOUT:-120}
TCPX_STOP_TIMEOUT=${TCPX_STOP_TIMEOUT:-60}
# Group allowed on the sockets: the job's group by default.
TCPX_SOCKET_GROUP=${TCPX_SOCKET_GROUP-${SLURM_JOB_GID:-}}
# More daemon flags, split on spaces.
TCPX_EXTRA_ARGS=${TCPX_EXTRA_ARGS:-}

TCPX_PID_FILE=$TCPX_STATE_DIR/$SLURM_JOB_ID.pid
TCPX_RC_FILE=$TCPX_STATE_DIR/$SLURM_JOB_ID.rc
TCPX_HEALTH_FILE=$TCPX_STATE_DIR/$SLURM_JOB_ID.health
TCPX_LOG_FILE=$TCPX_STATE_DIR/$SLURM_JOB_ID.log
# What the daemon logs, and writes to HEALTH_CHECK_LOG_FILE, once it serves.
TCPX_READY_LINE="Buffer manager initialization completed."

tcpx_log() { echo "tcpx-rxdm[job $SLURM_JOB_ID]: $*" >&2; }

tcpx_log_tail() {
  if [ -s "$TCPX_LOG_FILE" ]; then
    tcpx_log "last lines of $TCPX_LOG_FILE:"
    tail -n 20 "$TCPX_LOG_FILE" >&2
  fi
}
