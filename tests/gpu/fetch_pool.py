#!/usr/bin/env python3
"""Fetches GPU PCI's pool fd from socket folder UDS, as a client of the tenant
checks (tests/gpu/tenants.sh; tests/gpu_scripts.rs runs it against the sim
daemon). Prints "fd", or "status N: message".

  fetch_pool.py UDS PCI [PATH [MODE]]

With PATH it first opens that path and holds it open, as CUDA holds its device
nodes (MODE rw, the default: for reading and writing, as CUDA opens them; ro:
read-only; path: O_PATH; close: for reading and writing, closed again before
asking). A PATH it cannot open is reported in parentheses before the answer.
Python 3 only, no other module.
"""

import os
import socket
import sys

MODES = {"rw": os.O_RDWR, "ro": os.O_RDONLY, "path": os.O_PATH, "close": os.O_RDWR}


def varint(b, i):
    n = shift = 0
    while True:
        n |= (b[i] & 0x7F) << shift
        shift += 7
        i += 1
        if not b[i - 1] & 0x80:
            return n, i


def fields(b):
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        if key & 7 == 0:
            v, i = varint(b, i)
        else:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        yield key >> 3, v


def main():
    folder, gpu = sys.argv[1], sys.argv[2]
    held = None
    if len(sys.argv) > 3:
        mode = sys.argv[4] if len(sys.argv) > 4 else "rw"
        try:
            held = os.open(sys.argv[3], MODES[mode])
            if mode == "close":
                os.close(held)
        except OSError as e:
            print(f"({sys.argv[3]}: {e.strerror})", end=" ")
    msg = b"\x0a" + bytes([len(gpu)]) + gpu.encode()
    s = socket.socket(socket.AF_UNIX)
    s.connect(f"{folder}/get_gpu_fd_{gpu}")
    s.sendall(len(msg).to_bytes(2, "big") + msg)
    data, anc, flags, addr = s.recvmsg(4096, socket.CMSG_SPACE(4))
    while not anc and len(data) < 2 + int.from_bytes(data[:2], "big"):
        data += s.recv(4096)
    if anc:
        print("fd")
    else:
        status = dict(fields(data[2:])).get(5, b"")
        st = dict(fields(status))
        print(f"status {st.get(1, 0)}: {st.get(2, b'').decode()}")


if __name__ == "__main__":
    main()
