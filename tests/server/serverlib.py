"""Starting `diffuse serve` for a test and talking to it with the standard library only.

Every test starts its own server on a free loopback port (--port 0; the port is read from
the line it prints) and stops it with SIGTERM, checking it exits 0.
"""
import base64
import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib


class Server:
    def __init__(self, diffuse, *args, env=None):
        self.proc = subprocess.Popen([diffuse, "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        line = self.proc.stdout.readline()
        m = re.search(r"http://([0-9.]+):(\d+)/", line)
        if not m:
            self.proc.kill()
            raise SystemExit(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.host, self.port = m.group(1), int(m.group(2))
        self.url = f"http://{self.host}:{self.port}"

    def wait_ready(self, timeout=120):
        """Until the default model has loaded (progress says so)."""
        end = time.time() + timeout
        while time.time() < end:
            status, body, _ = self.request("GET", "/sdapi/v1/progress",
                                           headers=getattr(self, "auth", {}))
            if status == 200 and body["textinfo"] != "loading a model":
                return
            time.sleep(0.2)
        raise SystemExit("the model did not load")

    def request(self, method, path, body=None, headers=None, raw=None, timeout=600):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=headers or {})
        r = c.getresponse()
        text = r.read()
        c.close()
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text
        return r.status, parsed, dict(r.getheaders())

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise SystemExit("the server did not stop within 60 s of SIGTERM")
        err = self.proc.stderr.read()
        if rc != 0:
            raise SystemExit(f"the server exited {rc}: {err}")
        return err


def png_size_and_pixels(data):
    """(width, height, RGB bytes) of an 8-bit RGB PNG; raises on anything malformed."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG signature")
    i, idat, w = 8, b"", None
    while i < len(data):
        n, kind = struct.unpack(">I4s", data[i:i + 8])
        chunk = data[i + 8:i + 8 + n]
        crc = struct.unpack(">I", data[i + 8 + n:i + 12 + n])[0]
        if zlib.crc32(kind + chunk) != crc:
            raise ValueError(f"bad CRC in {kind}")
        if kind == b"IHDR":
            w, h, depth, colour = struct.unpack(">IIBB", chunk[:10])
            if (depth, colour) != (8, 2):
                raise ValueError("not 8-bit RGB")
        elif kind == b"IDAT":
            idat += chunk
        i += 12 + n
    raw = zlib.decompress(idat)
    stride = w * 3
    out, prev = bytearray(), bytearray(stride)
    for y in range(h):
        f, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = row[x - 3] if x >= 3 else 0
            b, c = prev[x], prev[x - 3] if x >= 3 else 0
            if f == 1:
                row[x] = (row[x] + a) & 255
            elif f == 2:
                row[x] = (row[x] + b) & 255
            elif f == 3:
                row[x] = (row[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[x] = (row[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += row
        prev = row
    return w, h, bytes(out)


def decode_b64_png(s):
    return png_size_and_pixels(base64.b64decode(s))


def check(cond, what):
    if not cond:
        print("FAIL:", what, file=sys.stderr)
        raise SystemExit(1)
    print("ok:", what)


def read_events(s, job, limit=600):
    """The events of a job's stream, as (name, data) pairs, until the stream ends."""
    c = socket.create_connection((s.host, s.port), timeout=limit)
    c.sendall(f"GET /v1/jobs/{job}/events HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while True:
        part = c.recv(65536)
        if not part:
            break
        data += part
        if b"event: done" in data or b"event: error" in data:
            if data.endswith(b"\n\n") or data.endswith(b"\r\n0\r\n\r\n"):
                break
    c.close()
    head, _, body = data.partition(b"\r\n\r\n")
    check(b"text/event-stream" in head, "the events stream is text/event-stream")
    if b"chunked" in head.lower():  # an event may span chunks: join them first
        joined, i = b"", 0
        while i < len(body):
            eol = body.find(b"\r\n", i)
            if eol < 0:
                break
            size = int(body[i:eol].split(b";")[0], 16)
            if size == 0:
                break
            joined += body[eol + 2:eol + 2 + size]
            i = eol + 2 + size + 2
        body = joined
    events, name = [], None
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[6:])))
    return events
