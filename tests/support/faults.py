"""Fault injection for tests/test_faults.py and tests/test_wire.py (a pytest plugin, loaded by
``tests/conftest.py``): a fault-injecting HTTP proxy and a fork server for processes that are killed
with SIGKILL.

- :class:`FaultProxy` — a thread-based HTTP/1.1 proxy on 127.0.0.1 in front of a real S3 server. A
  ``rule(request)`` decides, request by request, to pass it, answer an S3-style 5xx, reset the
  connection (before forwarding, or after the server has acted on it), delay the answer, corrupt a
  byte of the answer's body, or call a hook (kill a client process, wait at a barrier) — or misbehave
  on the wire the way broken servers and caching proxies do: ignore the range and stream an endless
  body, trickle the answer a byte at a time, answer a range with the whole object (``200``), answer a
  ``206`` longer than asked or starting before the asked offset, or cut the body short. Clients
  (s3fs/botocore) talk to it as to any endpoint; nothing in a client library is mocked.
- :class:`Zygote` — a child Python process that imports arcfmt and s3fs once, then forks one
  grandchild per job (a publisher or a follower), so that a test can start dozens of processes
  and kill each one at a chosen moment without paying the interpreter start-up every time. A job
  can also be armed to SIGKILL itself at its n-th "kill point" (before and after each call of a
  set of functions with side effects: fsync, rename, link, the folder exchange, local reads).

Run as ``python -m support.faults zygote`` (``tests/`` and the repository root on ``PYTHONPATH``, as
:class:`Zygote` starts it) it is the zygote.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: where ``support`` is found

# ===================================================================================== the proxy


@dataclass
class Request:
    n: int                      # 1-based, in arrival order (at the time its head was read)
    method: str
    target: str                 # path and query as sent
    headers: dict               # lower-case names
    attempt: int                # how many earlier requests had the same method, target and range
    t: float                    # time.monotonic() when it arrived
    action: str = "pass"
    status: int | None = None   # the upstream's status (None: not forwarded or no answer)
    sent: int = 0               # body bytes the proxy sent to the client for this request

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> str:
        return self.target.split("?", 1)[1] if "?" in self.target else ""

    @property
    def range(self) -> str | None:
        return self.headers.get("range")

    @property
    def key(self) -> tuple:
        return (self.method, self.target, self.range)

    def is_data(self) -> bool:
        """A request for a data object (``.arc``)."""
        return self.path.endswith(".arc")

    def __repr__(self):
        rng = f" {self.range}" if self.range else ""
        return f"<#{self.n} {self.method} {self.path}{rng} -> {self.action}/{self.status}>"


def act(do: str = "pass", *, status: int = 503, seconds: float = 0.0, before=None, after=None, extra: int = 0,
        earlier: int = 0) -> dict:
    """An action for a rule to return.

    ``do``: ``pass``; ``status`` (answer ``status`` with an S3 XML error, not forwarded); ``reset``
    (reset the connection, not forwarded); ``reset-after`` (forward, let the server answer, then reset
    the client's connection instead of relaying); ``delay`` (forward, hold the answer ``seconds``);
    ``corrupt`` (forward, flip one byte in the middle of the answer's body). ``before``/``after``:
    called with the request before forwarding / once the server has answered (before relaying).

    Wire faults (S3 requests are signed, Range included, so the request always reaches the server as
    sent; a ranged answer is then rewritten as a misbehaving server or caching proxy would send it):

    - ``endless``: not forwarded; answer ``200`` with a chunked body of zero bytes that never ends
      (until the client hangs up, or ``seconds``, default 60, pass): a server ignoring the Range;
    - ``trickle``: forward; relay the status line and headers at once, then the body one byte every
      ``seconds`` (each well inside the client's read timeout, so only a total deadline ends it);
    - ``whole``: forward; a ``206 bytes a-b/T`` answer becomes ``200`` with ``Content-Length: T``: the
      asked bytes at their place in the object, filler bytes (``0xA5``) everywhere else — a whole-object
      answer to a range request (the filler makes a client that slices wrongly fail its checks);
    - ``longer``: forward; a ``206`` answer gets ``extra`` filler bytes after the asked ones and
      ``earlier`` filler bytes before them, with a Content-Range that says so;
    - ``cut``: forward; relay the headers and only the first half of the body, then close.
    """
    return {"do": do, "status": status, "seconds": seconds, "before": before, "after": after, "extra": extra,
            "earlier": earlier}


FILLER = 0xA5
_CONTENT_RANGE = __import__("re").compile(rb"bytes (\d+)-(\d+)/(\d+|\*)")


def _dechunk(raw: bytes) -> bytes:
    """The data of a raw chunked body (as ``_read_chunked`` returns it)."""
    out, pos = [], 0
    while True:
        eol = raw.index(b"\n", pos)
        size = int(raw[pos:eol].split(b";", 1)[0].strip() or b"0", 16)
        pos = eol + 1
        if size == 0:
            return b"".join(out)
        out.append(raw[pos: pos + size])
        pos += size + 2


def _rewrite(rlines, rh, rbody, a) -> tuple:
    """``whole`` / ``longer``: rewrite a 206 answer (status line, headers, body); others pass as they are."""
    if rlines[0].split(b" ", 2)[1] != b"206":
        return rlines, rbody
    data = _dechunk(rbody) if "chunked" in rh.get("transfer-encoding", "").lower() else rbody
    m = _CONTENT_RANGE.match(rh.get("content-range", "").encode())
    if m is None:
        return rlines, rbody
    first, last = int(m.group(1)), int(m.group(2))
    total = int(m.group(3)) if m.group(3) != b"*" else last + 1
    fill = bytes([FILLER])
    if a["do"] == "whole":
        status = b"HTTP/1.1 200 OK\r\n"
        body = fill * first + data + fill * (total - last - 1)
        extra_headers = [f"Content-Length: {len(body)}\r\n".encode()]
    else:
        earlier = min(a["earlier"], first)
        body = fill * earlier + data + fill * a["extra"]
        new_first, new_last = first - earlier, last + a["extra"]
        status = rlines[0]
        extra_headers = [f"Content-Length: {len(body)}\r\n".encode(),
                         f"Content-Range: bytes {new_first}-{new_last}/{max(total, new_last + 1)}\r\n".encode()]
    keep = [ln for ln in rlines[1:-1] if ln.split(b":", 1)[0].strip().lower()
            not in (b"content-length", b"content-range", b"transfer-encoding")]
    return [status] + keep + extra_headers + [b"\r\n"], body


_S3_CODES = {500: "InternalError", 502: "BadGateway", 503: "ServiceUnavailable", 504: "GatewayTimeout",
             429: "SlowDown", 403: "AccessDenied"}


class _Closed(Exception):
    pass


def _read_line(f) -> bytes:
    line = f.readline(65537)
    if not line:
        raise _Closed()
    return line


def _read_head(f) -> list:
    lines = [_read_line(f)]
    while lines[-1] not in (b"\r\n", b"\n"):
        lines.append(_read_line(f))
        if len(lines) > 200:
            raise _Closed()
    return lines


def _headers(lines) -> dict:
    out = {}
    for raw in lines[1:-1]:
        k, _, v = raw.decode("latin-1").partition(":")
        out[k.strip().lower()] = v.strip()
    return out


def _read_exact(f, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise _Closed()
    return data


def _read_chunked(f) -> bytes:
    """A chunked body, raw (size lines, data and trailers), to be relayed as it came."""
    out = []
    while True:
        line = _read_line(f)
        out.append(line)
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while True:
                t = _read_line(f)
                out.append(t)
                if t in (b"\r\n", b"\n"):
                    return b"".join(out)
        out.append(_read_exact(f, size + 2))


def _reset(sock) -> None:
    """Close with an RST (SO_LINGER 0): the peer sees 'connection reset by peer'."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``); see the module doc.

    ``rule``: ``callable(Request) -> action dict or None`` (None: pass), called in the connection's
    thread (it may block, e.g. at a barrier). ``requests``: every request seen, in order.
    """

    def __init__(self, upstream: str, rule=None):
        hostport = upstream.split("://", 1)[1].rstrip("/")
        host, _, port = hostport.partition(":")
        self.upstream = (host, int(port))
        self.rule = rule
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._seen: dict = {}
        self._conns: set = set()
        self._closed = False
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._thread.start()

    # -- bookkeeping
    def reset_log(self) -> None:
        with self._lock:
            self.requests.clear()
            self._seen.clear()

    def count(self, pred=lambda r: True) -> int:
        with self._lock:
            return sum(1 for r in self.requests if pred(r))

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- serving
    def _accept(self) -> None:
        while not self._closed:
            try:
                c, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(c)
            threading.Thread(target=self._serve, args=(c,), name="fault-proxy-conn", daemon=True).start()

    def _new_request(self, lines) -> Request:
        method, target, _ = lines[0].decode("latin-1").split(" ", 2)
        headers = _headers(lines)
        with self._lock:
            key = (method, target, headers.get("range"))
            attempt = self._seen.get(key, 0)
            self._seen[key] = attempt + 1
            req = Request(len(self.requests) + 1, method, target, headers, attempt, time.monotonic())
            self.requests.append(req)
        return req

    def _serve(self, c) -> None:
        up = upf = None
        cf = c.makefile("rb", buffering=1 << 16)
        try:
            while True:
                lines = _read_head(cf)
                req = self._new_request(lines)
                h = req.headers
                if h.get("expect", "").lower() == "100-continue":
                    c.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    lines = [ln for ln in lines if not ln.lower().startswith(b"expect:")]
                if "chunked" in h.get("transfer-encoding", "").lower():
                    body = _read_chunked(cf)
                else:
                    body = _read_exact(cf, int(h.get("content-length", "0") or 0))
                a = (self.rule(req) if self.rule is not None else None) or act()
                req.action = a["do"]
                if a["before"] is not None:
                    a["before"](req)
                if a["do"] == "reset":
                    _reset(c)
                    return
                if a["do"] == "endless":
                    self._endless(c, req, a["seconds"] or 60.0)
                    return
                if a["do"] == "status":
                    code = a["status"]
                    msg = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{_S3_CODES.get(code, str(code))}'
                           f'</Code><Message>injected by the test proxy</Message><RequestId>fault-{req.n}'
                           f'</RequestId></Error>').encode()
                    c.sendall(f"HTTP/1.1 {code} Injected\r\nContent-Type: application/xml\r\n"
                              f"Content-Length: {len(msg)}\r\nx-amz-request-id: fault-{req.n}\r\n\r\n".encode() + msg)
                    continue
                # forward (one upstream connection per client connection, reopened when it closes)
                for attempt in range(2):
                    if up is None:
                        up = socket.create_connection(self.upstream, timeout=120)
                        upf = up.makefile("rb", buffering=1 << 16)
                    try:
                        up.sendall(b"".join(lines) + body)
                        rlines = _read_head(upf)
                        break
                    except (OSError, _Closed):
                        with contextlib.suppress(OSError):
                            up.close()
                        up = upf = None
                        if attempt:
                            raise
                status = int(rlines[0].split(b" ", 2)[1])
                req.status = status
                rh = _headers(rlines)
                if req.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                    rbody, until_close = b"", False
                elif "chunked" in rh.get("transfer-encoding", "").lower():
                    rbody, until_close = _read_chunked(upf), False
                elif "content-length" in rh:
                    rbody, until_close = _read_exact(upf, int(rh["content-length"])), False
                else:
                    rbody, until_close = upf.read(), True
                if a["after"] is not None:
                    a["after"](req)
                if a["do"] == "reset-after":
                    _reset(c)
                    return
                if a["do"] == "delay":
                    time.sleep(a["seconds"])
                if a["do"] == "corrupt" and rbody and "content-length" in rh:
                    b = bytearray(rbody)
                    b[len(b) // 2] ^= 0x20
                    rbody = bytes(b)
                if a["do"] in ("whole", "longer"):
                    rlines, rbody = _rewrite(rlines, rh, rbody, a)
                if a["do"] == "trickle":
                    c.sendall(b"".join(rlines))
                    for i in range(len(rbody)):
                        if self._closed:
                            return
                        time.sleep(a["seconds"])
                        c.sendall(rbody[i: i + 1])
                        req.sent += 1
                    continue
                if a["do"] == "cut":
                    c.sendall(b"".join(rlines) + rbody[: len(rbody) // 2])
                    req.sent += len(rbody) // 2
                    return
                c.sendall(b"".join(rlines) + rbody)
                req.sent += len(rbody)
                if until_close or rh.get("connection", "").lower() == "close" or \
                        h.get("connection", "").lower() == "close":
                    return
        except (OSError, _Closed, ValueError, IndexError):
            return
        finally:
            with contextlib.suppress(OSError):
                c.close()
            if up is not None:
                with contextlib.suppress(OSError):
                    up.close()
            with self._lock:
                self._conns.discard(c)


    def _endless(self, c, req, seconds: float) -> None:
        """Answer 200 with a chunked body of zero bytes until the client hangs up or ``seconds`` pass."""
        data = bytes(1 << 16)
        frame = f"{len(data):x}\r\n".encode() + data + b"\r\n"
        deadline = time.monotonic() + seconds
        try:
            c.settimeout(seconds)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nETag: \"endless\"\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n")
            while not self._closed and time.monotonic() < deadline:
                c.settimeout(max(0.05, deadline - time.monotonic()))
                c.sendall(frame)
                req.sent += len(data)
        except OSError:       # the client hung up (or stopped reading until the time was up)
            return


def s3_options(endpoint: str, *, read_timeout: float | None = None) -> dict:
    """fsspec storage options for an S3 client of ``endpoint`` (a proxy or a server)."""
    from support import servers

    so = {"key": servers.ACCESS_KEY, "secret": servers.SECRET_KEY, "client_kwargs": {"endpoint_url": endpoint}}
    if read_timeout is not None:
        so["config_kwargs"] = {"read_timeout": read_timeout, "connect_timeout": read_timeout}
    return so


def s3_fs(so: dict, *, strict: bool = False):
    """A fresh s3fs filesystem for ``so``. ``strict``: botocore and s3fs make one attempt each, so every
    fault reaches arcfmt's own retry layer (their retries would otherwise hide most of them)."""
    import s3fs

    so = dict(so)
    if strict:
        cfg = dict(so.get("config_kwargs") or {})
        cfg["retries"] = {"total_max_attempts": 1, "mode": "standard"}
        so["config_kwargs"] = cfg
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **so)
    if strict:
        fs.retries = 1
    return fs


# ===================================================================================== fixtures

try:
    import pytest
except ImportError:  # pragma: no cover - the zygote does not need it
    pytest = None

if pytest is not None:
    @pytest.fixture(scope="session")
    def zygote(tmp_path_factory):
        z = Zygote(str(tmp_path_factory.mktemp("zygote")))
        try:
            yield z
        finally:
            z.close()

    @pytest.fixture
    def make_proxy():
        """``make_proxy(server, rule=None)``: a :class:`FaultProxy` in front of ``server``, closed afterwards."""
        made = []

        def make(server, rule=None):
            p = FaultProxy(server.endpoint, rule)
            made.append(p)
            return p

        yield make
        for p in made:
            p.close()


# ===================================================================================== the zygote

class Zygote:
    """A pre-imported Python process that forks one job per :meth:`spawn` (see the module doc)."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
            [TESTS, os.path.dirname(TESTS)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
        self.proc = subprocess.Popen([sys.executable, "-m", "support.faults", "zygote"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=env,
                                     cwd=workdir, start_new_session=True)
        self._lock = threading.Lock()
        self._n = 0
        hello = self._reply()
        assert hello.get("ready"), hello

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote exited ({self.proc.poll()})")
        return json.loads(line)

    def _ask(self, **cmd) -> dict:
        with self._lock:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()
            return self._reply()

    def spawn(self, job: str, **kw) -> Job:
        """Fork a grandchild running ``JOBS[job](**kw)``; returns at once with its pid."""
        self._n += 1
        out = os.path.join(self.workdir, f"job-{self._n}.json")
        log = os.path.join(self.workdir, f"job-{self._n}.log")
        r = self._ask(op="spawn", job=job, kw=kw, out=out, log=log)
        return Job(self, r["pid"], out, log)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Job:
    zygote: Zygote
    pid: int
    out: str
    log: str
    rc: int | None = None
    started: float = field(default_factory=time.monotonic)

    def kill(self) -> None:
        """SIGKILL this job (by its pid; it is our own grandchild and not yet reaped)."""
        if self.rc is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        if self.rc is None:
            self.rc = self.zygote._ask(op="wait", pid=self.pid)["rc"]
        return self.rc

    def result(self) -> dict | None:
        """What the job returned (``{"ok": ..., ...}``), or None if it was killed before it finished."""
        self.wait()
        try:
            with open(self.out) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def log_text(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-4000:]
        except FileNotFoundError:
            return ""


# -------------------------------------------------------------------- inside the forked jobs

class KillPoints:
    """Counts "points" — just before and just after each call of the watched functions — and
    SIGKILLs this process at point ``kill_at``: its number (1-based), or ``[label, n]``, the n-th time
    the point ``label`` (e.g. ``"os.fsync:after"``) is reached. None: never; then ``count`` and
    ``names`` tell which points there were."""

    def __init__(self, kill_at):
        self.kill_at = kill_at
        self.count = 0
        self.names = []
        self._seen: dict = {}
        self._lock = threading.Lock()

    def hit(self, what: str) -> None:
        with self._lock:
            self.count += 1
            self.names.append(what)
            self._seen[what] = n = self._seen.get(what, 0) + 1
            k = self.kill_at
            if k is not None and (k == self.count if isinstance(k, int) else (k[0] == what and k[1] == n)):
                os.kill(os.getpid(), signal.SIGKILL)

    def watch(self, obj, attr: str) -> None:
        orig = getattr(obj, attr)
        label = f"{getattr(obj, '__name__', type(obj).__name__)}.{attr}"

        def wrapper(*a, **k):
            self.hit(label + ":before")
            try:
                return orig(*a, **k)
            finally:
                self.hit(label + ":after")

        setattr(obj, attr, wrapper)


_ARMED: list = []


def _arm(kill_at, local_reads: bool) -> KillPoints:
    import shutil

    from fsspec.implementations.local import LocalFileSystem

    import arcfmt.staging as S

    kp = KillPoints(kill_at)
    _ARMED.append(kp)
    for name in ("fsync", "rename", "replace", "link", "unlink"):
        kp.watch(os, name)
    kp.watch(shutil, "rmtree")
    kp.watch(S, "exchange_dirs")
    kp.watch(S, "_remove_tree")   # the old folder's removal after the exchange
    if local_reads:
        kp.watch(LocalFileSystem, "cat_file")
        kp.watch(LocalFileSystem, "cat_ranges")
    return kp


def job_publish(url, so, shard, num_shards, step, path, state_dir, writer=None, kill_at=None,
                keyframe_every=10, tmp_dir=None, strict=False):
    from arcfmt.store import Publisher

    kp = _arm(kill_at, local_reads=not url.startswith("s3://"))
    fs = s3_fs(so, strict=True) if strict else None
    pub = Publisher(url, shard=shard, num_shards=num_shards, storage_options=so or None, fs=fs, state_dir=state_dir,
                    writer=writer, effort="fast", keyframe_every=keyframe_every, tmp_dir=tmp_dir, workers=1)
    res = pub.publish(step, path)
    return dict(res.as_dict(), points=kp.count, names=kp.names)


def job_follow(url, so, into, chunk_size=1 << 20, concurrency=16, until=None, kill_at=None, tensors=None,
               strict=False):
    from arcfmt.store import Follower

    kp = _arm(kill_at, local_reads=not url.startswith("s3://"))
    fs = s3_fs(so, strict=True) if strict else None
    fol = Follower(url, into, storage_options=so or None, fs=fs, chunk_size=chunk_size, concurrency=concurrency,
                   tensors=tensors, workers=1, backoff=0.05)
    ups = [u.as_dict() for u in fol.sync(until=until)]
    return {"updates": ups, "points": kp.count, "names": kp.names, "stats": fol.stats.as_dict()}


def job_live(url, snapshot, kill_at=None):
    """A live follower (model in memory, a snapshot after every step) catching up from its snapshot."""
    from arcfmt.store import Follower

    kp = _arm(kill_at, local_reads=not url.startswith("s3://"))
    fol = Follower(url, live={}, snapshot=snapshot, snapshot_every=1, workers=1)
    ups = [u.as_dict() for u in fol.sync()]
    return {"updates": ups, "points": kp.count, "names": kp.names}


JOBS = {"publish": job_publish, "follow": job_follow, "live": job_live}


def _zygote_main() -> None:  # pragma: no cover - runs in the child process
    import numpy  # noqa: F401 - imported once here, shared by every fork
    import s3fs  # noqa: F401

    import arcfmt.store  # noqa: F401
    from arcfmt.errors import ArcError

    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "wait":
            _, status = os.waitpid(cmd["pid"], 0)
            out.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
            out.flush()
            continue
        out.flush()
        pid = os.fork()
        if pid:
            out.write(json.dumps({"pid": pid}) + "\n")
            out.flush()
            continue
        # the job: stdout/stderr to its log, its result to a file, never back into the zygote's pipe
        code = 3
        try:
            fd = os.open(cmd["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = sys.stdout
            try:
                try:
                    res = {"ok": True, "result": JOBS[cmd["job"]](**cmd["kw"])}
                finally:
                    for kp in _ARMED:      # writing the result is not a kill point
                        kp.kill_at = None
                code = 0
            except ArcError as exc:
                res = {"ok": False, "category": exc.category, "type": type(exc).__name__, "message": str(exc)}
                code = 1
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                import traceback
                traceback.print_exc()
                res = {"ok": False, "category": "internal", "type": type(exc).__name__, "message": str(exc)}
            tmp = cmd["out"] + ".tmp"
            with open(tmp, "w") as f:
                json.dump(res, f)
            os.replace(tmp, cmd["out"])
        finally:
            sys.stdout.flush()
            os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["zygote"]:
        from support import servers
        servers.use_client_env()
        _zygote_main()
