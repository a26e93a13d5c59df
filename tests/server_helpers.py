"""Start and stop a drgym search server on a free loopback port (tests, benchmarks).

A test helper, not part of the installed package: tests import it as ``server_helpers``;
a script under ``scripts/`` puts ``tests/`` on ``sys.path`` first.

Two ways, one context manager::

    from server_helpers import running_server

    with running_server(engine) as srv:                 # uvicorn in a thread of this process
        httpx.get(f"{srv.url}/search", params={"query": "x"})

    with running_server(cli_args=["--corpus", "wiki-default", "--method", "dense"]) as srv:
        ...                                             # `python -m drgym serve` subprocess

The thread form reuses an already loaded backend (fast, but shares this process's GIL
with the caller); the subprocess form is the real CLI in its own process (what a
throughput benchmark with many client threads should use). Both wait until
``GET /health`` answers and stop the server on exit, even on error.

For any other server (an MCP app, ``drgym mcp --transport http``), :func:`serving_app`
runs an ASGI app under uvicorn in a thread and :func:`running_command` a command that
listens on a port; both wait until it is up and stop it on exit.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from drgym.search.base import SearchBackend
from drgym.search.wire import ServerSettings
from drgym.server.app import uvicorn_options


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (bind to port 0, then close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    """Handle of a started server.

    Attributes:
        url: ``http://host:port`` (no trailing slash).
        port: the TCP port.
        process: the ``drgym serve`` subprocess (subprocess form), else None.
        log_path: file collecting the subprocess's stdout and stderr, else None.
    """

    url: str
    port: int
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    _stop: object = field(default=None, repr=False)

    def log_text(self) -> str:
        """What the subprocess printed so far ('' for the thread form)."""
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return ""


def _wait_healthy(url: str, timeout: float, alive) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("server exited during start-up")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"server at {url} did not answer /health within {timeout:.0f} s")


@contextmanager
def running_server(
    backend: SearchBackend | None = None,
    *,
    settings: ServerSettings | None = None,
    cli_args: Sequence[str] = (),
    host: str = "127.0.0.1",
    startup_timeout: float = 300.0,
    env: dict[str, str] | None = None,
    header_timeout_s: float | None = None,
    body_timeout_s: float | None = None,
    keep_alive_s: float | None = None,
) -> Iterator[RunningServer]:
    """Run a drgym server for the duration of a ``with`` block.

    Args:
        backend: serve this backend from a uvicorn thread in this process; None starts
            ``python -m drgym serve --host HOST --port PORT *cli_args`` instead.
        settings: server settings for the thread form (``host``/``port`` are ignored).
        cli_args: extra ``drgym serve`` options for the subprocess form.
        host: loopback address to bind.
        startup_timeout: seconds to wait for ``/health`` (the subprocess may build an index).
        env: extra environment variables of the subprocess.
        header_timeout_s, body_timeout_s, keep_alive_s: the server's slow-client timeouts
            in seconds (see :func:`drgym.server.app.uvicorn_options`); None: the defaults.
            The subprocess form passes them as ``--header-timeout``, ``--body-timeout``
            and ``--keep-alive-timeout``.

    Yields:
        A :class:`RunningServer` with ``url``.

    Raises:
        RuntimeError: the subprocess exited during start-up (its output is in the message).
        TimeoutError: no healthy answer within ``startup_timeout``.
    """
    timeouts = {k: v for k, v in (("header_timeout_s", header_timeout_s), ("body_timeout_s", body_timeout_s),
                                  ("keep_alive_s", keep_alive_s)) if v is not None}
    if backend is not None:
        yield from _thread_server(backend, settings, host, startup_timeout, timeouts)
    else:
        flags = {"header_timeout_s": "--header-timeout", "body_timeout_s": "--body-timeout",
                 "keep_alive_s": "--keep-alive-timeout"}
        extra = [a for k, v in timeouts.items() for a in (flags[k], str(v))]
        yield from _process_server([*cli_args, *extra], host, startup_timeout, env)


def _thread_server(backend, settings, host, startup_timeout, timeouts) -> Iterator[RunningServer]:
    import uvicorn

    from drgym.server.app import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    app = create_app(backend, settings or ServerSettings())
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, **uvicorn_options(**timeouts))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"drgym-server-{port}")
    thread.start()
    url = f"http://{host}:{port}"
    try:
        _wait_healthy(url, startup_timeout, thread.is_alive)
        yield RunningServer(url=url, port=port)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def _process_server(cli_args, host, startup_timeout, env) -> Iterator[RunningServer]:
    port = free_port(host)
    fd, log_name = tempfile.mkstemp(prefix=f"drgym-serve-{port}-", suffix=".log")
    log_path = Path(log_name)
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    cmd = [sys.executable, "-m", "drgym", "serve", "--host", host, "--port", str(port), *cli_args]
    with os.fdopen(fd, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=full_env)
    url = f"http://{host}:{port}"
    try:
        try:
            _wait_healthy(url, startup_timeout, lambda: proc.poll() is None)
        except RuntimeError as e:
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}: {log_path.read_text(errors='replace')[-2000:]}") from e
        yield RunningServer(url=url, port=port, process=proc, log_path=log_path)
    finally:
        if proc.poll() is None:
            proc.terminate()  # SIGTERM: uvicorn shuts down gracefully
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        try:
            log_path.unlink()
        except FileNotFoundError:
            pass


@contextmanager
def serving_app(app, host: str = "127.0.0.1", port: int | None = None, *,
                startup_timeout: float = 30.0, **config) -> Iterator[int]:
    """uvicorn serving the ASGI ``app`` on ``host`` in a daemon thread of this process.

    Args:
        app: the ASGI application.
        host: address to bind.
        port: TCP port; None: a free one (:func:`free_port`).
        startup_timeout: seconds to wait for uvicorn to report that it started.
        config: further ``uvicorn.Config`` options (e.g. drgym's
            :func:`~drgym.server.app.uvicorn_options`).

    Yields:
        The port. The server is asked to exit and its thread joined (15 s) on exit.

    Raises:
        RuntimeError: the server thread died or did not start within ``startup_timeout``.
    """
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                           **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the test server on {host}:{port} did not start")
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(15)


@contextmanager
def running_command(cmd: Sequence[str], port: int, log_path: Path, *, env: dict[str, str] | None = None,
                    host: str = "127.0.0.1", startup_timeout: float = 120.0) -> Iterator[subprocess.Popen]:
    """Run ``cmd`` (a server that listens on ``host:port``) for the duration of a ``with``
    block, its stdout and stderr written to ``log_path``.

    Args:
        cmd: the command line.
        port: the TCP port the command listens on.
        log_path: file that collects the output (read into the assertion messages).
        env: extra environment variables (over this process's).
        host: where to connect to check that it listens.
        startup_timeout: seconds to wait for a TCP connection to be accepted.

    Yields:
        The process, once ``host:port`` accepts a connection; it is terminated and waited
        for (30 s) on exit.

    Raises:
        AssertionError: the process exited, or did not listen within ``startup_timeout``
            (the message holds its output).
    """
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **env} if env else None)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)
