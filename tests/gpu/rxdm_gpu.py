#!/usr/bin/env python3
"""Client side of the GPU device check (tests/gpu/check.sh) and the bare-driver
half of the pool benchmark. Needs python3 and cuda-bindings (`cuda.bindings`),
nothing else: the wire protocol is written out here by hand.

Subcommands:
  list UDS                       GPUs served under UDS (from the socket names)
  write UDS PCI SEED             fetch fd + metadata, import, map, fill a pattern
  read UDS PCI SEED              fetch fd + metadata, import, map, compare
  ipc-write UDS PCI SEED         --gpu_shmem_type file: open the IPC handle, fill
  ipc-read UDS PCI SEED          ... and compare
  notfound UDS PCI               an unknown GPU gets a status, never an fd
  fdinfo PID N                   PID holds N fds with exp_name nv_dmabuf
  bench SIZES ITERS              bare driver calls, JSON lines like pool_bench
  compare RUST.jsonl PY.jsonl    table of medians and ratios
Each check prints `PASS name: detail` or `FAIL name: detail`; exit 1 on FAIL.
"""

import array
import json
import os
import re
import socket
import statistics
import struct
import sys
import time

FAILED = False


def report(ok, name, detail=""):
    global FAILED
    FAILED |= not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return ok


# --- wire protocol -------------------------------------

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def raw_bytes_request(payload):
    """UnixSocketProto{raw_bytes=1}, framed with a 2-byte big-endian length."""
    msg = b"\x0a" + varint(len(payload)) + payload
    return struct.pack(">H", len(msg)) + msg


def parse_proto(msg):
    """-> (raw_bytes or None, (code, message) or None)."""
    raw, status, i = None, None, 0
    while i < len(msg):
        key, i = read_varint(msg, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, i = read_varint(msg, i)
            continue
        if wire != 2:
            raise ValueError(f"unexpected wire type {wire}")
        n, i = read_varint(msg, i)
        body, i = msg[i:i + n], i + n
        if field == 1:
            raw = bytes(body)
        elif field == 5:
            code, text, j = 0, "", 0
            while j < len(body):
                k, j = read_varint(body, j)
                if k == 0x08:
                    code, j = read_varint(body, j)
                elif k == 0x12:
                    m, j = read_varint(body, j)
                    text, j = body[j:j + m].decode(), j + m
                else:
                    raise ValueError("unexpected Status field")
            status = (code, text)
    return raw, status


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("daemon closed the connection")
        buf += chunk
    return buf


def recv_proto(sock, first=b""):
    head = first + recv_exact(sock, 2 - len(first))
    (n,) = struct.unpack(">H", head)
    return parse_proto(recv_exact(sock, n))


def connect(uds, name):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.path.join(uds, name))
    return s


def fetch_fd(uds, pci):
    """-> (fd, None) or (None, (code, message))."""
    with connect(uds, f"get_gpu_fd_{pci}") as s:
        s.sendall(raw_bytes_request(pci.encode()))
        data, anc, flags, _ = s.recvmsg(1, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
        if flags & socket.MSG_CTRUNC:
            raise RuntimeError("control data truncated (MSG_CTRUNC)")
        fds = array.array("i")
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % 4])
        if len(fds) == 1 and len(data) == 1:
            return fds[0], None
        for fd in fds:
            os.close(fd)
        _, status = recv_proto(s, data)  # not an fd: the reply is a proto
        return None, status


def fetch_metadata(uds, pci):
    """-> (fd_number, size, alignment)."""
    with connect(uds, f"get_gpu_metadata_{pci}") as s:
        s.sendall(raw_bytes_request(pci.encode()))
        raw, status = recv_proto(s)
    if raw is None or len(raw) != 24:
        raise RuntimeError(f"bad metadata reply raw={raw!r} status={status}")
    return struct.unpack("<i4xQQ", raw)


def fetch_ipc_handle(uds, pci):
    with connect(uds, "get_gpu_by_gpu_pci") as s:
        s.sendall(raw_bytes_request(pci.encode()))
        raw, status = recv_proto(s)
    if raw is None or len(raw) != 64:
        raise RuntimeError(f"bad IPC handle reply raw={raw!r} status={status}")
    return raw


# --- CUDA driver (cuda-bindings) --------------------------------------------

def cu_mod():
    from cuda.bindings import driver
    return driver


def ck(result, what):
    cu = cu_mod()
    err, rest = result[0], result[1:]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err}")
    return rest[0] if len(rest) == 1 else rest


def cuda_device(pci):
    cu = cu_mod()
    ck(cu.cuInit(0), "cuInit")
    dev = ck(cu.cuDeviceGetByPCIBusId(pci.encode()), "cuDeviceGetByPCIBusId")
    ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return dev


def location(dev):
    cu = cu_mod()
    loc = cu.CUmemLocation()
    loc.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    loc.id = int(dev)
    return loc


def map_rw(dev, handle, size, alignment):
    cu = cu_mod()
    ptr = ck(cu.cuMemAddressReserve(size, alignment, 0, 0), "cuMemAddressReserve")
    ck(cu.cuMemMap(ptr, size, 0, handle, 0), "cuMemMap")
    desc = cu.CUmemAccessDesc()
    desc.location = location(dev)
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ck(cu.cuMemSetAccess(ptr, size, [desc], 1), "cuMemSetAccess")
    return ptr


def pattern(size, seed):
    import numpy as np
    idx = np.arange(size // 4, dtype=np.uint32)
    return idx * np.uint32(2654435761) + np.uint32(seed)


def import_pool(uds, pci):
    cu = cu_mod()
    # CUDA first, as in an NCCL job: from cuInit on the process holds the
    # GPU's device node open, which is what the daemon's tenant check asks for.
    dev = cuda_device(pci)
    fd, status = fetch_fd(uds, pci)
    if fd is None:
        raise RuntimeError(f"no fd for {pci}: status {status}")
    meta_fd, size, alignment = fetch_metadata(uds, pci)
    kind = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    handle = ck(cu.cuMemImportFromShareableHandle(fd, kind), "cuMemImportFromShareableHandle")
    os.close(fd)
    ptr = map_rw(dev, handle, size, alignment)
    return ptr, size, alignment, meta_fd


def cmd_write(uds, pci, seed):
    cu = cu_mod()
    ptr, size, alignment, meta_fd = import_pool(uds, pci)
    report(size > 0 and size % alignment == 0, "metadata", f"size={size} alignment={alignment} daemon_fd={meta_fd}")
    data = pattern(size, int(seed))
    ck(cu.cuMemcpyHtoD(ptr, data.ctypes.data, size), "cuMemcpyHtoD")
    ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    report(True, "import+write", f"pid {os.getpid()} imported the fd, mapped {size} bytes at {int(ptr):#x}, wrote the pattern")


def cmd_read(uds, pci, seed):
    import numpy as np
    cu = cu_mod()
    ptr, size, _, _ = import_pool(uds, pci)
    got = np.empty(size // 4, dtype=np.uint32)
    ck(cu.cuMemcpyDtoH(got.ctypes.data, ptr, size), "cuMemcpyDtoH")
    want = pattern(size, int(seed))
    bad = int(np.count_nonzero(got != want))
    report(bad == 0, "import+read", f"pid {os.getpid()} read {size} bytes back, {bad} words differ")


def ipc_open(uds, pci):
    cu = cu_mod()
    cuda_device(pci)  # first, as import_pool says
    raw = fetch_ipc_handle(uds, pci)
    import ctypes
    h = cu.CUipcMemHandle()
    ctypes.memmove(h.getPtr(), raw, 64)  # the binding exposes no field setter
    flag = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    return ck(cu.cuIpcOpenMemHandle(h, flag), "cuIpcOpenMemHandle")


def cmd_ipc(uds, pci, seed, write):
    import numpy as np
    cu = cu_mod()
    ptr = ipc_open(uds, pci)
    size = 1 << 20
    want = pattern(size, int(seed))
    if write:
        ck(cu.cuMemcpyHtoD(ptr, want.ctypes.data, size), "cuMemcpyHtoD")
        ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        report(True, "ipc-write", f"pid {os.getpid()} opened the 64-byte IPC handle and wrote 1 MiB")
    else:
        got = np.empty(size // 4, dtype=np.uint32)
        ck(cu.cuMemcpyDtoH(got.ctypes.data, ptr, size), "cuMemcpyDtoH")
        bad = int(np.count_nonzero(got != want))
        report(bad == 0, "ipc-read", f"pid {os.getpid()} read 1 MiB back, {bad} words differ")


def cmd_notfound(uds, socket_pci, asked_pci):
    with connect(uds, f"get_gpu_fd_{socket_pci}") as s:
        s.sendall(raw_bytes_request(asked_pci.encode()))
        data, anc, _, _ = s.recvmsg(1, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
        got_fd = bool(anc)
        status = None if got_fd else recv_proto(s, data)[1]
    report(not got_fd and status is not None and status[0] == 5, "fd-notfound",
           f"asked get_gpu_fd_{socket_pci} for {asked_pci}: status {status}, fd {'sent' if got_fd else 'not sent'}")


def cmd_list(uds):
    for name in sorted(os.listdir(uds)):
        if name.startswith("get_gpu_fd_"):
            print(name[len("get_gpu_fd_"):])


def cmd_fdinfo(pid, want):
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = f.read()
        except OSError:
            continue
        m = re.search(r"^exp_name:\s*(\S+)", info, re.M)
        if m and m.group(1) == "nv_dmabuf":
            size = re.search(r"^size:\s*(\d+)", info, re.M)
            found.append(f"fd {fd} size {size.group(1) if size else '?'}")
    report(len(found) == int(want), "dmabuf-fdinfo",
           f"daemon pid {pid} holds {len(found)} nv_dmabuf fds (want {want}): {'; '.join(found)}")


# --- benchmark --------------------------------------------------------------

def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(s[:-1] if mult > 1 else s) * mult


def cmd_bench(sizes, iters, gpu_index=0):
    """The driver calls CudaAllocator makes, in the same order."""
    cu = cu_mod()
    cold = time.perf_counter()
    ck(cu.cuInit(0), "cuInit")
    dev = ck(cu.cuDeviceGet(gpu_index), "cuDeviceGet")
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
    rdma = ck(cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute")
    ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    fd_kind = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR

    def setup(size):
        ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = fd_kind
        prop.location = location(dev)
        prop.allocFlags.gpuDirectRDMACapable = 1 if rdma else 0
        gran = ck(cu.cuMemGetAllocationGranularity(
            prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity")
        size = -(-size // gran) * gran
        handle = ck(cu.cuMemCreate(size, prop, 0), "cuMemCreate")
        fd = ck(cu.cuMemExportToShareableHandle(handle, fd_kind, 0), "cuMemExportToShareableHandle")
        ptr = map_rw(dev, handle, size, gran)
        dmabuf = ck(cu.cuMemGetHandleForAddressRange(
            ptr, size, cu.CUmemRangeHandleType.CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0), "dma-buf")
        return size, handle, int(fd), ptr, int(dmabuf)

    def free(size, handle, fd, ptr, dmabuf):
        ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        os.close(dmabuf)
        ck(cu.cuMemUnmap(ptr, size), "cuMemUnmap")
        ck(cu.cuMemAddressFree(ptr, size), "cuMemAddressFree")
        ck(cu.cuMemRelease(handle), "cuMemRelease")
        os.close(fd)

    free(*setup(64 << 20))
    cold_ms = (time.perf_counter() - cold) * 1e3
    for size in sizes:
        setups, frees = [], []
        for _ in range(iters):
            t = time.perf_counter()
            pool = setup(size)
            setups.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            free(*pool)
            frees.append((time.perf_counter() - t) * 1e3)
        print(json.dumps({"impl": "python", "size": size, "cold_ms": round(cold_ms, 3),
                          "setup_ms": [round(x, 3) for x in setups], "free_ms": [round(x, 3) for x in frees]}),
              flush=True)


def cmd_compare(*paths):
    rows = {}
    for p in paths:
        with open(p) as f:
            for line in f:
                if line.startswith("{"):
                    r = json.loads(line)
                    rows.setdefault((r["size"], r["impl"]), []).append(r)
    print(f"{'size':>8} {'rust setup ms':>14} {'python setup ms':>16} {'ratio':>6} "
          f"{'rust free ms':>13} {'python free ms':>15}")
    worst = 0.0
    for size in sorted({s for s, _ in rows}):
        def med(impl, key):
            return statistics.median(x for r in rows.get((size, impl), []) for x in r[key])
        rs, ps = med("rust", "setup_ms"), med("python", "setup_ms")
        ratio = rs / ps
        worst = max(worst, ratio)
        label = f"{size >> 30} GiB" if size >= 1 << 30 else f"{size >> 20} MiB"
        print(f"{label:>8} {rs:14.3f} {ps:16.3f} {ratio:6.2f} {med('rust', 'free_ms'):13.3f} "
              f"{med('python', 'free_ms'):15.3f}")
    colds = {impl: statistics.median(r["cold_ms"] for (s, i), rs in rows.items() if i == impl for r in rs)
             for impl in ("rust", "python")}
    print(f"cold (init + context + first 64 MiB pool): rust {colds['rust']:.1f} ms, python {colds['python']:.1f} ms")
    report(worst <= 2.0, "bench-within-2x", f"worst setup ratio rust/python = {worst:.2f}")


def main(argv):
    cmd, args = argv[1], argv[2:]
    try:
        if cmd == "list":
            cmd_list(*args)
        elif cmd == "write":
            cmd_write(*args)
        elif cmd == "read":
            cmd_read(*args)
        elif cmd == "ipc-write":
            cmd_ipc(*args, write=True)
        elif cmd == "ipc-read":
            cmd_ipc(*args, write=False)
        elif cmd == "notfound":
            cmd_notfound(*args)
        elif cmd == "fdinfo":
            cmd_fdinfo(*args)
        elif cmd == "bench":
            cmd_bench([parse_size(s) for s in args[0].split(",")], int(args[1]))
        elif cmd == "compare":
            cmd_compare(*args)
        else:
            raise SystemExit(f"unknown subcommand {cmd}")
    except Exception as e:  # report and fail, keep the script going
        report(False, cmd, f"{type(e).__name__}: {e}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
