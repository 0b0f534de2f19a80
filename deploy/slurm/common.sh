# shellcheck shell=bash disable=SC2034
# Shared settings and helpers of prolog.sh, epilog.sh and task-prolog.sh
# (sourced, not run). Keep slurm.conf's PrologEpilogTimeout above
# TCPX_READY_TIMEOUT and TCPX_STOP_TIMEOUT.
#
# Where a setting comes from, first match wins:
#   1. the environment (a site wrapper or a test that exports it; slurmd
#      itself passes only SLURM_* variables to prologs and epilogs);
#   2. the settings file, /etc/tcpx-rxdm/slurm.conf (TCPX_SLURM_CONF names
#      another), with one VAR=value per line (slurm.conf.example lists them);
#   3. the defaults below.
# The file is read as data, never sourced: these scripts run as root, and a
# settings file must not be a way to run commands. Only the names below are
# accepted; a value is taken literally except that $SLURM_JOB_ID and
# ${SLURM_JOB_ID} become the job's id; surrounding quotes are removed.

: "${SLURM_JOB_ID:?SLURM_JOB_ID is not set: run this as a Slurm prolog/epilog}"

TCPX_SETTINGS=(TCPX_RXDM_BIN TCPX_UDS_PATH TCPX_STATE_DIR TCPX_HTTP TCPX_PRESET
  TCPX_READY_TIMEOUT TCPX_STOP_TIMEOUT TCPX_SOCKET_GROUP TCPX_EXTRA_ARGS)
TCPX_SLURM_CONF=${TCPX_SLURM_CONF:-/etc/tcpx-rxdm/slurm.conf}

tcpx_log() { echo "tcpx-rxdm[job $SLURM_JOB_ID]: $*" >&2; }
# Milliseconds since the script started (its last line says how long it took).
tcpx_t0=${EPOCHREALTIME//[!0-9]/}
tcpx_ms() { echo $(((${EPOCHREALTIME//[!0-9]/} - tcpx_t0) / 1000)); }

# Reads TCPX_SLURM_CONF, if present, into the settings the environment left unset.
tcpx_read_settings() {
  local file=$TCPX_SLURM_CONF line name value n=0 owner mode
  [ -e "$file" ] || return 0
  if ! read -r owner mode < <(stat -Lc '%u %a' -- "$file"); then
    tcpx_log "error: cannot read $file"
    return 1
  fi
  # Root acts on this file: only its owner (root, or whoever runs the script) may write it.
  if [ "$owner" != 0 ] && [ "$owner" != "$(id -u)" ]; then
    tcpx_log "error: $file belongs to uid $owner; it must belong to root"
    return 1
  fi
  if (( 8#$mode & 8#022 )); then
    tcpx_log "error: $file is writable by group or others (mode $mode); chmod go-w it"
    return 1
  fi
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line=${line%$'\r'}
    [[ $line =~ ^[[:space:]]*(#.*)?$ ]] && continue
    if ! [[ $line =~ ^[[:space:]]*([A-Z_][A-Z0-9_]*)=(.*)$ ]]; then
      tcpx_log "error: $file:$n: expected VAR=value, got: $line"
      return 1
    fi
    name=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
    if [[ " ${TCPX_SETTINGS[*]} " != *" $name "* ]]; then
      tcpx_log "error: $file:$n: unknown setting $name (known: ${TCPX_SETTINGS[*]})"
      return 1
    fi
    if [[ $value =~ ^\"(.*)\"$ || $value =~ ^\'(.*)\'$ ]]; then
      value=${BASH_REMATCH[1]}
    fi
    value=${value//\$\{SLURM_JOB_ID\}/$SLURM_JOB_ID}
    value=${value//\$SLURM_JOB_ID/$SLURM_JOB_ID}
    # The environment wins over the file.
    if [ -z "${!name+set}" ]; then
      printf -v "$name" '%s' "$value"
    fi
  done <"$file"
}
tcpx_read_settings || exit 1

# The daemon binary.
TCPX_RXDM_BIN=${TCPX_RXDM_BIN:-/usr/local/bin/tcpx-rxdm}
# The job's socket folder; task-prolog.sh points the job's NCCL plugin at it.
TCPX_UDS_PATH=${TCPX_UDS_PATH:-/run/tcpx-$SLURM_JOB_ID}
# pid, exit-status, health and log files of the per-job daemons.
TCPX_STATE_DIR=${TCPX_STATE_DIR:-/run/tcpx-rxdm-slurm}
# HTTP endpoints (/metrics, /readyz, /debug/*): off unless set. HOST:0 lets
# the kernel pick a free port per job (the prolog prints it).
TCPX_HTTP=${TCPX_HTTP-}
# GPU/NIC preset: auto (discovery), a3vm, ...
TCPX_PRESET=${TCPX_PRESET:-auto}
# Seconds to wait for the ready line, and for the daemon to exit.
TCPX_READY_TIMEOUT=${TCPX_READY_TIMEOUT:-120}
TCPX_STOP_TIMEOUT=${TCPX_STOP_TIMEOUT:-60}
# Group allowed on the sockets: the job's group by default.
TCPX_SOCKET_GROUP=${TCPX_SOCKET_GROUP:-${SLURM_JOB_GID:-}}
# More daemon flags, split on spaces.
TCPX_EXTRA_ARGS=${TCPX_EXTRA_ARGS:-}

# "PID STARTTIME" of the daemon: the start time tells our daemon from a
# later process that got the same pid.
TCPX_PID_FILE=$TCPX_STATE_DIR/$SLURM_JOB_ID.pid
TCPX_RC_FILE=$TCPX_STATE_DIR/$SLURM_JOB_ID.rc
TCPX_HEALTH_FILE=$TCPX_STATE_DIR/$SLURM_JOB_ID.health
TCPX_LOG_FILE=$TCPX_STATE_DIR/$SLURM_JOB_ID.log
# What the daemon logs, and writes to HEALTH_CHECK_LOG_FILE, once it serves.
TCPX_READY_LINE="Buffer manager initialization completed."

tcpx_log_tail() {
  if [ -s "$TCPX_LOG_FILE" ]; then
    tcpx_log "last lines of $TCPX_LOG_FILE:"
    tail -n 20 "$TCPX_LOG_FILE" >&2
  fi
}

# Start time (clock ticks since boot) of process $1; fails if it is gone.
tcpx_start_time() {
  local stat rest
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  # Fields after the command name (which may hold spaces and parentheses).
  rest=${stat##*) }
  read -r -a rest <<<"$rest"
  echo "${rest[19]}"
}

# Sets tcpx_pid and tcpx_started from the pid file; fails if there is none.
tcpx_read_pid_file() {
  [ -s "$TCPX_PID_FILE" ] || return 1
  read -r tcpx_pid tcpx_started <"$TCPX_PID_FILE" || true
  [[ $tcpx_pid =~ ^[0-9]+$ ]]
}

# Whether the process in the pid file is still the daemon started for this job.
tcpx_daemon_alive() {
  local now
  tcpx_read_pid_file || return 1
  now=$(tcpx_start_time "$tcpx_pid") || return 1
  [ -z "${tcpx_started:-}" ] || [ "$now" = "$tcpx_started" ]
}

# Removes the job's socket folder: socket files, the daemon's lock file and
# the nccl.env it writes (left behind when it was killed) only, so that a
# mistyped TCPX_UDS_PATH never deletes anything else.
tcpx_remove_socket_dir() {
  [ -d "$TCPX_UDS_PATH" ] || return 0
  find "$TCPX_UDS_PATH" -mindepth 1 -maxdepth 1 \( -type s -o -name .rxdm.lock -o -name terminated -o -name nccl.env \) -delete 2>/dev/null || true
  rmdir "$TCPX_UDS_PATH" 2>/dev/null || tcpx_log "warning: $TCPX_UDS_PATH is not empty; left in place"
}
