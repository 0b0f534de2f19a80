#!/bin/sh
# The host's sysfs of an a3-highgpu-8g whose GPU NICs were moved into a Pod's
# network namespace (GKE multi-networking), made under ROOT for a container's
# /hostsysfs: the PCI tree of the a3vm preset (four PCIe switches, each with
# two H100s and the gVNIC of eth1..eth4 at the preset's addresses), every
# function under bus/pci/devices, the NICs' NUMA nodes, two NUMA nodes of
# CPUs, cubic's hystart_detect, and a class/net that lists only the host's
# own eth0 (the Pod's NICs are not the host namespace's any more).
#   fake-host-sysfs.sh ROOT
set -eu
root=$1
mkdir -p "$root/bus/pci/devices" "$root/class/net"
# function PATH VENDOR CLASS: a PCI function's folder (PATH under devices/)
# with its ids, and its bus/pci/devices link.
function_at() {
  mkdir -p "$root/devices/$1"
  echo "$2" >"$root/devices/$1/vendor"
  echo "$3" >"$root/devices/$1/class"
  ln -s "../../../devices/$1" "$root/bus/pci/devices/${1##*/}"
}
hex() { printf '%02x' "$1"; }
# block ROOT_COMPLEX ROOT_PORT FIRST_BUS NUMA: root port, switch, two GPUs and a NIC.
block() {
  rp=pci0000:$1/0000:$1:$2
  up=$rp/0000:$(hex $(($3 - 3))):00.0
  function_at "$rp" 0x8086 0x060400
  function_at "$up" 0x1000 0x060400
  for i in 0 1 2; do
    dsp=$up/0000:$(hex $(($3 - 2))):0$((i + 1)).0
    function_at "$dsp" 0x1000 0x060400
    if [ "$i" = 2 ]; then
      function_at "$dsp/0000:$(hex $(($3 + i))):00.0" 0x1ae0 0x020000
      echo "$4" >"$root/devices/$dsp/0000:$(hex $(($3 + i))):00.0/numa_node"
    else
      function_at "$dsp/0000:$(hex $(($3 + i))):00.0" 0x10de 0x030200
    fi
  done
}
block 00 01.0 4 0
block 00 02.0 10 0
block 80 01.0 132 1
block 80 02.0 138 1
function_at pci0000:00/0000:00:04.0 0x1ae0 0x020000
mkdir -p "$root/devices/pci0000:00/0000:00:04.0/net/eth0"
ln -s ../../../0000:00:04.0 "$root/devices/pci0000:00/0000:00:04.0/net/eth0/device"
ln -s ../../devices/pci0000:00/0000:00:04.0/net/eth0 "$root/class/net/eth0"
for n in 0 1; do
  mkdir -p "$root/devices/system/node/node$n"
  echo "$((n * 2))-$((n * 2 + 1))" >"$root/devices/system/node/node$n/cpulist"
done
mkdir -p "$root/module/tcp_cubic/parameters"
echo 3 >"$root/module/tcp_cubic/parameters/hystart_detect"
