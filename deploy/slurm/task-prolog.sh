#!/bin/bash
# Slurm TaskProlog: points the NCCL plugin of every task at this job's daemon,
# the folder the operator configured (/etc/tcpx-rxdm/slurm.conf, see
# common.sh). It runs in the job's environment, so the job's own TCPX_*
# variables are ignored: only TCPX_SLURM_CONF (where the file is) is kept.
set -euo pipefail
for v in "${!TCPX_@}"; do
  [ "$v" = TCPX_SLURM_CONF ] || unset "$v"
done
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$(readlink -f "$0")")/common.sh"
echo "export NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=$TCPX_UDS_PATH"
