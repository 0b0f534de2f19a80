#!/bin/sh
# A GPU NIC as sysfs discovery (--gpu_nic_preset=auto) sees one, made under
# a folder that stands for /sys (--sysfs_root): interface IFNAME on a PCI
# function two hops below a PCIe switch that also holds an NVIDIA GPU. The
# interface's class/net link is made last, as the kernel adds it. Used by
# .ci/systemd-test for a GPU NIC that appears after the daemon started.
#   fake-gpu-sysfs.sh ROOT IFNAME
set -eu
root=$1
ifname=$2
switch=$root/devices/pci0000:00/0000:00:01.0/0000:01:00.0
# function DIR VENDOR CLASS: a PCI function's folder with its vendor and class.
function_at() {
  mkdir -p "$1"
  echo "$2" >"$1/vendor"
  echo "$3" >"$1/class"
}
function_at "$root/devices/pci0000:00/0000:00:01.0" 0x8086 0x060400
function_at "$switch" 0x1000 0x060400
function_at "$switch/0000:02:01.0" 0x1000 0x060400
function_at "$switch/0000:02:01.0/0000:03:00.0" 0x10de 0x030200
function_at "$switch/0000:02:02.0" 0x1000 0x060400
function_at "$switch/0000:02:02.0/0000:04:00.0" 0x1ae0 0x020000
nic=$switch/0000:02:02.0/0000:04:00.0
mkdir -p "$nic/net/$ifname" "$root/class/net"
ln -s ../../../0000:04:00.0 "$nic/net/$ifname/device"
ln -s "../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:04:00.0/net/$ifname" \
  "$root/class/net/$ifname"
