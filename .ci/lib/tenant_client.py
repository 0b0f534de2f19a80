#!/usr/bin/env python3
"""A tenant's view of the daemon under --tenant_isolation=enforce, for the CI
scripts that run the daemon for real (the systemd unit in a container).

Usage: tenant_client.py [--pools] SOCKET_FOLDER OWN_GPU OTHER_GPU
       tenant_client.py --hold SOCKET_FOLDER OWN_GPU RELEASE_FILE
       tenant_client.py --pod SOCKET_FOLDER GPU

First it opens every /dev/nvidia<N> it can for reading and writing and keeps them open, as a CUDA
process does from cuInit on: the daemon counts a GPU as a tenant's only
while the tenant's process holds its device node open. Then it opens a TCP
connection on loopback and asks rx_rule_manager, as the NCCL plugin does
after accept(), to steer it to OWN_GPU (must succeed); to steer it to
OTHER_GPU, whose device node this process does not hold (must be refused
with PERMISSION_DENIED); and to steer a flow nobody holds (refused too).
With --pools it also asks for OWN_GPU's receive pool (an fd must come) and
OTHER_GPU's (refused). Prints one line per request; exits 0 when every answer
is the expected one. The wire format is encoded here by hand (no protobuf
library).

With --pod it is the workload of a Pod whose own daemon checks nothing
(--tenant_isolation=off): it gets GPU's pool (an fd) and a rule steering its
own connection to GPU, and exits 0 when both came.

With --hold it is a job that lives through a daemon upgrade: it steers its
own connection to OWN_GPU, registers with rxdm_application_registry and
keeps that connection, prints `holding, source port N`, then waits until
RELEASE_FILE exists and exits 0 only if the registry connection is still
open (the daemon that took over kept it).
"""
import os
import socket
import sys
import time

PERMISSION_DENIED = 7


def hold_gpu_nodes():
    """Opens each /dev/nvidia<N> this process may open for reading and writing (as CUDA does); returns the fds (kept open)."""
    held = []
    for name in sorted(os.listdir("/dev")):
        if name.startswith("nvidia") and name[6:].isdigit():
            try:
                held.append(os.open("/dev/" + name, os.O_RDWR))
            except OSError:
                pass
    return held


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(number, payload):
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def int_field(number, value):
    return varint(number << 3) + varint(value)


def address(ip, port):
    return field(1, ip.encode()) + int_field(2, port)


def rule(local, remote, gpu):
    """The install request for the flow arriving from remote at local."""
    ntuple = int_field(1, 1) + field(2, address(*remote)) + field(3, address(*local))
    request = field(1, ntuple) + field(3, gpu.encode())
    msg = field(2, request)
    return len(msg).to_bytes(2, "big") + msg


def status_code(reply):
    """The google.rpc.Status code of a reply (0 when it has none)."""
    body, i = reply[2:], 0
    while i < len(body):
        key = body[i]
        i += 1
        number, kind = key >> 3, key & 7
        if kind == 0:
            while body[i] & 0x80:
                i += 1
            i += 1
            continue
        length, shift = 0, 0
        while True:
            b = body[i]
            i += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if number == 5:
            status = body[i:i + length]
            return status[1] if status and status[0] == 0x08 else 0
        i += length
    return 0


def read_frame(s, reply):
    """Reads from s until reply holds one whole length-prefixed frame (or EOF)."""
    while len(reply) < 2 or len(reply) < 2 + int.from_bytes(reply[:2], "big"):
        more = s.recv(4096)
        if not more:
            break
        reply += more
    return reply


def ask(folder, frame):
    s = socket.socket(socket.AF_UNIX)
    s.connect(folder + "/rx_rule_manager")
    s.sendall(frame)
    reply = read_frame(s, b"")
    s.close()
    return status_code(reply)


def pool(folder, gpu):
    """Asks for GPU's receive pool: (fd size, 0) when an fd came, else (None, status)."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(folder + "/get_gpu_fd_" + gpu)
    msg = field(1, gpu.encode())
    s.sendall(len(msg).to_bytes(2, "big") + msg)
    first, anc, _, _ = s.recvmsg(1, socket.CMSG_SPACE(4 * 4))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fd = int.from_bytes(data[:4], sys.byteorder)
            size = os.fstat(fd).st_size
            os.close(fd)
            s.close()
            return size, 0
    reply = read_frame(s, first)
    s.close()
    return None, status_code(reply)


def own_connection():
    """A loopback connection of this process: the listener, its two ends, the accepted end's address and peer."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    accepted, peer = listener.accept()
    return (listener, client, accepted), accepted.getsockname(), peer


def pod(folder, gpu):
    size, got = pool(folder, gpu)
    print(f"pool of {gpu}: " + (f"an fd ({size} bytes)" if size is not None else f"status {got}"), flush=True)
    keep, local, peer = own_connection()
    status = ask(folder, rule(local, peer, gpu))
    print(f"rule for its own connection to {gpu}: status {status} (expected 0)", flush=True)
    return 0 if size is not None and status == 0 else 1


def hold(folder, own, release):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    accepted, peer = listener.accept()
    got = ask(folder, rule(accepted.getsockname(), peer, own))
    print(f"own connection, own GPU: status {got} (expected 0)", flush=True)
    if got != 0:
        return 1
    registry = socket.socket(socket.AF_UNIX)
    registry.connect(folder + "/rxdm_application_registry")
    # ApplicationRegisterRequest (field 6) with register_client (field 1) = true.
    msg = field(6, int_field(1, 1))
    registry.sendall(len(msg).to_bytes(2, "big") + msg)
    reply = b""
    while len(reply) < 2 or len(reply) < 2 + int.from_bytes(reply[:2], "big"):
        more = registry.recv(4096)
        if not more:
            print("registry closed the connection", flush=True)
            return 1
        reply += more
    print(f"registered: status {status_code(reply)}", flush=True)
    print(f"holding, source port {peer[1]}", flush=True)
    while not os.path.exists(release):
        time.sleep(0.1)
    registry.setblocking(False)
    try:
        still_open = registry.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        still_open = True
    print("registry connection: " + ("open" if still_open else "closed by the daemon"), flush=True)
    client.close()
    accepted.close()
    return 0 if still_open else 1


def main():
    held = hold_gpu_nodes()
    print(f"GPU device nodes held open: {len(held)}", flush=True)
    if sys.argv[1] == "--hold":
        return hold(*sys.argv[2:5])
    if sys.argv[1] == "--pod":
        return pod(*sys.argv[2:4])
    pools = sys.argv[1] == "--pools"
    folder, own, other = sys.argv[2:5] if pools else sys.argv[1:4]
    keep, local, peer = own_connection()
    ok = True
    if pools:
        for gpu, want in ((own, "fd"), (other, PERMISSION_DENIED)):
            size, got = pool(folder, gpu)
            said = f"an fd ({size} bytes)" if size is not None else f"status {got}"
            print(f"pool of {gpu}: {said} (expected {want})", flush=True)
            ok &= (size is not None) if want == "fd" else (size is None and got == want)
    cases = [
        ("own connection, own GPU", rule(local, peer, own), 0),
        ("own connection, another GPU", rule(local, peer, other), PERMISSION_DENIED),
        ("a connection nobody holds", rule(local, ("127.0.0.1", 1), own), PERMISSION_DENIED),
    ]
    for name, frame, want in cases:
        got = ask(folder, frame)
        print(f"{name}: status {got} (expected {want})", flush=True)
        ok &= got == want
    for s in keep:
        s.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
