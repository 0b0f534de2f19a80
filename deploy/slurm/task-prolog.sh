#!/bin/bash
# Slurm TaskProlog: points the NCCL plugin of every task at this job's daemon.
echo "export NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=${TCPX_UDS_PATH:-/run/tcpx-$SLURM_JOB_ID}"
