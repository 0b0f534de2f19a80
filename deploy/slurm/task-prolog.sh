#!/bin/bash
# Slurm TaskProlog: gives every task the NCCL settings of this job's daemon
# (its nccl.env), or at least its socket folder: the folder the operator configured (/etc/tcpx-rxdm/slurm.conf, see
# common.sh). It runs in the job's environment, so the job's own TCPX_*
# variables are ignored: only TCPX_SLURM_CONF (where the file is) is kept.
set -euo pipefail
for v in "${!TCPX_@}"; do
  [ "$v" = TCPX_SLURM_CONF ] || unset "$v"
done
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$(readlink -f "$0")")/common.sh"
# The daemon's NCCL settings for this node, written to its socket folder before
# the prolog saw it ready. Slurm takes `export NAME=value` lines literally (no
# shell quoting), so the file is sourced here and each variable printed bare;
# the job's own NCCL_* variables are set aside first.
for v in "${!NCCL_@}"; do
  unset "$v"
done
if [ -r "$TCPX_UDS_PATH/nccl.env" ]; then
  # shellcheck source=/dev/null
  . "$TCPX_UDS_PATH/nccl.env"
  for v in "${!NCCL_@}"; do
    echo "export $v=${!v}"
  done
else
  echo "export NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=$TCPX_UDS_PATH"
fi
