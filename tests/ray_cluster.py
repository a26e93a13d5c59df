"""Start and stop a Ray cluster of several nodes on this machine (tests, scripts).

A test helper, not part of the installed package: tests import it as ``ray_cluster``;
a script under ``scripts/`` puts ``tests/`` on ``sys.path`` first (as ``server_helpers``).

Each node is its own ``ray start --block`` process (a head, then workers joined to it),
so each has its own raylet, object store and resources, as on separate machines::

    from ray_cluster import local_cluster

    with local_cluster([{"node_a": 1}, {"node_b": 1}], num_cpus=1) as c:
        ray.init(address=c.address)       # or: drgym serve-ray --ray-address c.address
        ...

The cluster uses Ray's token authentication (the default of ``ray start`` in Ray 2.60)
with a token of its own: :attr:`LocalCluster.client_env` holds ``RAY_AUTH_MODE`` and
``RAY_AUTH_TOKEN`` for a client subprocess, and this process has them set (and Ray's
token cache refreshed) for the lifetime of the context. Every port is chosen free
(nothing collides with another Ray on the machine), the session files go to a fresh
short folder under the system temp dir (Ray's unix sockets must fit in 107 bytes), and
on exit each node's ``ray start`` is stopped with SIGTERM, then what is left of its
session (the raylet, GCS, dashboard and workers it started) with SIGKILL, by PID: only
processes this helper started are touched, never ``ray stop`` (which stops every Ray on
the machine). :meth:`LocalCluster.kill_node` kills one node the same way (a machine that
dies) and :meth:`LocalCluster.add_node` starts another. :func:`leftover_processes` lists
what of a cluster is still running (the tests check it is empty).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HOTPOT_QUESTIONS = [
    "If Gallu is a demon Lilu is what?",
    "Who was the bishop of Elmham?",
    "Which queen of Lotharingia was married to Lothair II?",
    "What river flows through the capital?",
    "demon of the underworld",
    "Which university did the author attend?",
]
"""Queries the Ray serving checks ask (real HotpotQA questions and short keyword queries)."""

from server_helpers import free_port


@dataclass
class LocalCluster:
    """Handle of a started cluster.

    Attributes:
        address: the head's GCS address, ``127.0.0.1:PORT`` (``ray.init(address=...)``,
            ``drgym serve-ray --ray-address``).
        dashboard_url: the head's dashboard (the state API: ``ray.util.state.list_actors
            (address=dashboard_url)``).
        temp_dir: the session folder of every node.
        node_resources: the custom resources asked of each node, head first.
        processes: the ``ray start --block`` process of each node, head first.
        log_paths: where each node's ``ray start`` output goes.
        client_env: environment a client needs (the cluster's auth token).
        num_cpus, object_store_mb, node_env, start_timeout_s: as :func:`local_cluster`
            (the settings of a node added later).
    """

    address: str
    dashboard_url: str
    temp_dir: Path
    node_resources: list[dict]
    processes: list[subprocess.Popen] = field(default_factory=list)
    log_paths: list[Path] = field(default_factory=list)
    client_env: dict[str, str] = field(default_factory=dict)
    num_cpus: int = 1
    object_store_mb: int = 150
    node_env: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 180.0

    def add_node(self, resources: dict) -> int:
        """Start a node (the head when it is the first) offering ``resources``; wait until
        it is alive. Returns its index in :attr:`processes`."""
        i = len(self.processes)
        args = [_ray_cli(), "start", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1",
                "--num-cpus", str(self.num_cpus), "--num-gpus", "0", "--resources", json.dumps(resources),
                "--object-store-memory", str(self.object_store_mb * 2**20),
                "--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
                "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
                "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port())]
        if i == 0:
            args += ["--head", "--port", self.address.rsplit(":", 1)[1], "--temp-dir", str(self.temp_dir),
                     "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
                     "--dashboard-port", self.dashboard_url.rsplit(":", 1)[1],
                     "--ray-client-server-port", str(free_port())]
        else:
            args += ["--address", self.address]
        log = self.temp_dir / f"node{i}.log"
        self.log_paths.append(log)
        if i >= len(self.node_resources):
            self.node_resources.append(dict(resources))
        alive = 0 if i == 0 else len(self._alive_nodes())
        with open(log, "wb") as fh:
            self.processes.append(subprocess.Popen(args, env=self.node_env, stdout=fh, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, start_new_session=True))
        _wait_for_nodes(self, alive + 1, self.start_timeout_s)
        return i

    def kill_node(self, i: int, timeout_s: float = 120.0) -> float:
        """SIGKILL every process of node ``i`` (its ``ray start``, raylet, agents and
        workers), as a machine that dies, and wait until the head's health checks mark it
        dead.

        Returns:
            Seconds from the kill until the state API no longer lists the node alive.

        Raises:
            TimeoutError: still listed alive after ``timeout_s``.
        """
        ids = self.node_ids()
        node_id = next(ids[k] for k in self.node_resources[i] if k in ids)
        t0 = time.monotonic()
        _kill_sessions({self.processes[i].pid})
        self.processes[i].wait(timeout=10)
        while time.monotonic() - t0 < timeout_s:
            if node_id not in {n.node_id for n in self._alive_nodes()}:
                return time.monotonic() - t0
            time.sleep(0.5)
        raise TimeoutError(f"node {i} ({node_id}) still alive {timeout_s:g} s after it was killed.")

    def _alive_nodes(self) -> list:
        from ray.util.state import list_nodes

        # raise_on_missing_output=False: while a node dies the state API cannot reach it and
        # would raise instead of listing the others
        return list_nodes(address=self.dashboard_url, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)

    def node_ids(self) -> dict[str, str]:
        """Node id (hex) of each custom resource name asked of the nodes, e.g.
        ``{"node_a": "3f..", "node_b": "9c.."}``, from the state API."""
        from ray.util.state import list_nodes

        out = {}
        for n in list_nodes(address=self.dashboard_url, filters=[("state", "=", "ALIVE")], detail=True,
                            raise_on_missing_output=False):
            for name in n.resources_total:
                if any(name in r for r in self.node_resources):
                    out[name] = n.node_id
        return out


def _session_pids(sessions: set[int], needle: bytes) -> dict[int, str]:
    """PID -> command line of the running processes (zombies aside) in one of
    ``sessions`` (or process groups of those ids) or whose command line holds ``needle``."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            stat = (p / "stat").read_text()
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        state, _ppid, pgid, sid = stat[stat.rindex(")") + 2:].split()[:4]
        if state != "Z" and (int(sid) in sessions or int(pgid) in sessions or (needle and needle in cmd)):
            out[int(p.name)] = cmd.replace(b"\0", b" ").decode(errors="replace").strip()
    return out


def leftover_processes(c: LocalCluster) -> list[str]:
    """Processes of the cluster still running (zombies aside): those in the session of a
    node's ``ray start`` (Ray's workers are renamed ``ray::...``, so the session, not the
    command line, is what marks them) or naming the cluster's temp dir. Read from ``/proc``.

    Returns:
        ``"PID: command line"`` of each, empty once the cluster is stopped.
    """
    found = _session_pids({p.pid for p in c.processes}, str(c.temp_dir).encode())
    return [f"{pid}: {cmd[:200]}" for pid, cmd in sorted(found.items())]


def _refresh_ray_auth() -> None:
    """Make this process's Ray read the auth settings of ``os.environ`` again (as Ray's
    own tests do: the config first, then the token cache)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _ray_cli() -> str:
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else "ray"


def _wait_for_nodes(c: LocalCluster, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    err: Exception | None = None
    while time.monotonic() < deadline:
        proc, log = c.processes[-1], c.log_paths[-1]  # the node being started
        if proc.poll() is not None:
            raise RuntimeError(f"a Ray node exited with {proc.returncode} while starting: {log.read_text()[-3000:]}")
        try:
            if len(c._alive_nodes()) >= n:
                return
        except Exception as e:  # noqa: BLE001 - the dashboard is not up yet; retried until the deadline
            err = e
        time.sleep(1.0)
    logs = "\n".join(f"--- {p}\n{p.read_text()[-2000:]}" for p in c.log_paths)
    raise TimeoutError(f"{n} Ray node(s) not alive after {timeout_s:g} s (last state API error: {err!r})\n{logs}")


def _kill_sessions(sessions: set[int], timeout_s: float = 30.0) -> None:
    """SIGKILL, by PID, every process of ``sessions`` until none is left (or ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = _session_pids(sessions, b"")
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def _stop(procs: list[subprocess.Popen], grace_s: float = 30.0) -> None:
    for proc in reversed(procs):  # workers first, the head last
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    # Whatever the nodes started and left running (workers of Ray's detached actors outlive
    # their raylet for a while): every process of their sessions, by PID.
    _kill_sessions({p.pid for p in procs})
    for proc in procs:
        if proc.poll() is None:
            proc.wait(timeout=10)


@contextmanager
def local_cluster(node_resources: list[dict], *, num_cpus: int = 1, object_store_mb: int = 150,
                  env: dict | None = None, start_timeout_s: float = 180.0) -> Iterator[LocalCluster]:
    """A Ray cluster of ``len(node_resources)`` nodes on this machine, stopped on exit.

    Args:
        node_resources: custom resources of each node, head first (e.g. ``[{"node_a": 1},
            {"node_b": 1}]``): what pins an actor or task to a node.
        num_cpus: CPUs each node offers.
        object_store_mb: each node's object store (MiB).
        env: extra environment of the nodes (their workers inherit it).
        start_timeout_s: seconds to wait for every node to be alive.

    Raises:
        RuntimeError: a node's ``ray start`` exited while starting (its log in the message).
        TimeoutError: the nodes were not all alive in time.
    """
    tmp = Path(tempfile.mkdtemp(prefix="drgray-", dir="/tmp" if Path("/tmp").is_dir() else None))
    c = LocalCluster(address=f"127.0.0.1:{free_port()}", dashboard_url=f"http://127.0.0.1:{free_port()}", temp_dir=tmp,
                     node_resources=[dict(r) for r in node_resources], num_cpus=num_cpus,
                     object_store_mb=object_store_mb, start_timeout_s=start_timeout_s)
    c.client_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    c.node_env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1",
                  "TOKENIZERS_PARALLELISM": "false", **(env or {}), **c.client_env}
    saved = {k: os.environ.get(k) for k in (*c.client_env, "RAY_AUTH_TOKEN_PATH")}
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    os.environ.update(c.client_env)
    _refresh_ray_auth()
    try:
        for res in node_resources:
            c.add_node(res)
        yield c
    finally:
        _stop(c.processes)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _refresh_ray_auth()
        if not leftover_processes(c):
            shutil.rmtree(tmp, ignore_errors=True)
