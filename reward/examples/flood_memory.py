#!/usr/bin/python3
"""reward/examples/flood_memory.py - tries to exhaust a reward server's memory with raw ZMTP 3.0 clients and prints
the server's peak resident memory (VmHWM from /proc/PID/status), the measurement of reward/PROTOCOL.md section 3.

No libzmq on the client side: each connection is a plain TCP or Unix socket that does the NULL-mechanism greeting
and READY handshake by hand, then sends what a hostile or broken peer could send:

  --mode frame   one frame whose header declares --declare-mb MiB, then --send-mb MiB of its body (never finished);
  --mode parts   frames of --part-kb KiB with the MORE flag, --send-mb MiB in all, never ending the message.

    /usr/bin/python3 reward/examples/flood_memory.py --server-pid PID --connect ipc:///tmp/r.sock \
        --connections 8 --declare-mb 1024 --send-mb 300

It reports, per connection, how many bytes the server took before it closed or stopped reading, and the server's
VmHWM before and after. The connections are held open until all have sent (or been refused) and the server has
had --settle seconds to read what is in flight.
"""
import argparse
import socket
import struct
import sys
import threading
import time


def vm_kib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def open_raw(endpoint):
    if endpoint.startswith("ipc://"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(endpoint[6:])
    elif endpoint.startswith("tcp://"):
        host, port = endpoint[6:].rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
    else:
        raise ValueError("endpoint must be ipc:// or tcp://")
    return s


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError("closed by the server after %d of %d handshake bytes" % (len(b), n))
        b += c
    return b


def handshake(s):
    """ZMTP 3.0 NULL greeting and READY as a DEALER. Raises ConnectionError when the server refuses."""
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL" + b"\0" * 16 + b"\x00" + b"\0" * 31
    s.sendall(greeting)
    recv_exact(s, 64)
    prop = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    body = b"\x05READY" + prop
    s.sendall(bytes([0x04, len(body)]) + body)
    flags = recv_exact(s, 1)[0]
    size = struct.unpack(">Q", recv_exact(s, 8))[0] if flags & 0x02 else recv_exact(s, 1)[0]
    cmd = recv_exact(s, size)
    if not cmd.startswith(b"\x05READY"):
        raise ConnectionError("refused at the handshake: %r" % cmd[:60])


def flood(idx, args, result):
    sent, why = 0, "sent all"
    try:
        s = open_raw(args.connect)
        s.settimeout(args.stall)
        handshake(s)
        chunk = b"\xab" * (1 << 20)
        total = args.send_mb << 20
        if args.mode == "frame":
            s.sendall(bytes([0x02]) + struct.pack(">Q", args.declare_mb << 20))
            while sent < total:
                n = s.send(chunk[: min(len(chunk), total - sent)])
                sent += n
        else:
            part = args.part_kb << 10
            hdr = bytes([0x03]) + struct.pack(">Q", part)
            body = b"\xcd" * part
            while sent < total:
                s.sendall(hdr + body)
                sent += part
        result[idx] = (sent, why, s)  # kept open: the server must not be let off by a close
        return
    except socket.timeout:
        why = "server stopped reading (%.0f s stall)" % args.stall
    except (ConnectionError, BrokenPipeError, OSError) as e:
        why = "closed: %s" % e
    result[idx] = (sent, why, None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server-pid", type=int, required=True)
    ap.add_argument("--connect", required=True, help="the server's endpoint, ipc://PATH or tcp://HOST:PORT")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--mode", choices=("frame", "parts"), default="frame")
    ap.add_argument("--declare-mb", type=int, default=1024, help="frame size the header declares (--mode frame)")
    ap.add_argument("--send-mb", type=int, default=300, help="bytes each connection sends, MiB")
    ap.add_argument("--part-kb", type=int, default=1024, help="size of each part (--mode parts), KiB")
    ap.add_argument("--stall", type=float, default=3.0, help="seconds a send may block before giving up")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds to wait before reading VmHWM")
    args = ap.parse_args()
    before = vm_kib(args.server_pid, "VmHWM")
    result = [None] * args.connections
    th = [threading.Thread(target=flood, args=(i, args, result)) for i in range(args.connections)]
    t0 = time.monotonic()
    for t in th:
        t.start()
    for t in th:
        t.join()
    time.sleep(args.settle)
    after, rss = vm_kib(args.server_pid, "VmHWM"), vm_kib(args.server_pid, "VmRSS")
    for i, (sent, why, _) in enumerate(result):
        print("connection %d: %d MiB taken, %s" % (i, sent >> 20, why))
    print("server pid %d: VmHWM before %.1f MiB, after %.1f MiB (VmRSS now %.1f MiB), %.1f s"
          % (args.server_pid, before / 1024, after / 1024, rss / 1024, time.monotonic() - t0))
    for _, _, s in result:
        if s:
            s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
