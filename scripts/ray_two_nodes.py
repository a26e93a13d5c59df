"""drgym on a Ray cluster of two nodes on one machine: the distributed index build and
``drgym serve-ray`` with the shards on different nodes, checked against the local build
and the single-process ``drgym serve``; then a shard replica killed mid-serve.

    python scripts/ray_two_nodes.py --out scripts/results/ray_two_nodes.json

Needs the ``distributed`` extra (``pip install -e '.[distributed]'``). Steps, all with
the real commands as subprocesses:

1. Two nodes, each its own ``ray start --block`` (raylet, object store, resources): a
   head offering ``{"node_a": 1}`` and a worker offering ``{"node_b": 1}``, one CPU each
   (``tests/ray_cluster.py``).
2. ``drgym index build --corpus hotpotqa --ray --ray-address ADDR --shard-size 600``:
   the encoder actors (one CPU each, so one per node) and the FAISS shard tasks, with the
   node each ran on (Ray's state API); the folder compared file by file with a local
   build of the same spec (``tests/test_index_scale.py::assert_same_index``).
3. ``drgym serve-ray --index-dir <the Ray-built index> --ray-address ADDR --config C``
   where ``C`` pins shard 0 to ``node_a`` and shard 1 to ``node_b``
   (``shard.per_shard``); every replica's node from the state API. Then ``drgym serve
   --index-dir`` on the same folder, and the same requests to both: ``/search`` and
   ``/fineweb/search`` (k=10, with distances), ``POST /retrieve`` (top 5, with scores),
   ``/fetch`` of every URL returned: ids and scores compared (largest score difference
   recorded) and the JSON bodies compared whole. Both query encoders run on ONNX
   Runtime float32 (``router.server.encoder_backend``, ``--encoder-backend``) with the
   result cache off.
4. The shard-1 replica's process is killed (SIGKILL): the answers while it is gone
   (``partial`` naming shard 1, as docs/scale.md says), and the seconds until Ray Serve
   has started a new replica (on ``node_b`` again) and the answers equal step 3's again.
   Then the whole worker node is killed (every process of it, SIGKILL): the seconds until
   the head marks it dead, the answers while no node offers ``node_b`` (partial), and,
   after a new node offering ``node_b`` joins, the seconds until Serve has placed shard 1
   on it and the answers equal step 3's again.
5. Ctrl-C (SIGINT) to ``drgym serve-ray``: its exit status and the Serve actors left.
6. The cluster stopped: processes of it left running (none expected).

:func:`run` returns the record (``tests/test_ray_two_nodes.py`` runs it and checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # ray_cluster, server_helpers, test_index_scale

from ray_cluster import HOTPOT_QUESTIONS  # noqa: E402  (tests/ on the path above)

QUERIES = HOTPOT_QUESTIONS + ["Teutberga queen", "American rock band formed in 1990s"]
"""Queries asked of both servers (real HotpotQA questions and short keyword queries)."""

SHARD_SIZE = 600
"""Rows per dense shard: HotpotQA's 1,069 passages make 2 shards."""

WAIT_FOR_ACTORS = {"RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S": "600"}
"""Ray Data's own setting: the build hands out units once every encoder actor is up (both
nodes), not as soon as the first is (it would encode HotpotQA's 3 cached units alone)."""

CHUNK_DOCS = 400
"""Documents per build unit: HotpotQA's 994 make 3 units, so both encoder actors (one a
node) get work."""

TWO_NODE_CONFIG = {
    "shard_timeout_s": 5.0,
    "proxy_location": "HeadOnly",  # one HTTP proxy: the two nodes share one IP address, their proxies one port
    "router": {"server": {"encoder_backend": "onnx", "cache_mb": 0},
               "deployment": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.5}}},
    "shard": {"deployment": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.5}},
              "per_shard": {0: {"deployment": {"ray_actor_options": {"resources": {"node_a": 0.5}}}},
                            1: {"deployment": {"ray_actor_options": {"resources": {"node_b": 0.5}}}}}},
}
"""The ``--config`` of ``drgym serve-ray``: one replica each, shard 0 on the node offering
``node_a``, shard 1 on the one offering ``node_b``; one HTTP proxy, on the head; the router's query encoder on ONNX
Runtime float32 (not the CPU default, int8: the setting must reach the router) and its
result cache off (every request is searched, also the same ones after a restart)."""

SINGLE_ARGS = ["--encoder-backend", "onnx", "--cache-mb", "0"]
"""The same settings for ``drgym serve``."""


def _env(cluster) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **cluster.client_env}


def _drgym(args: list[str], cluster, log: Path, timeout_s: float = 900, env: dict | None = None) -> str:
    with open(log, "wb") as fh:
        p = subprocess.run([sys.executable, "-m", "drgym", *args], env={**_env(cluster), **(env or {})}, stdout=fh,
                           stderr=subprocess.STDOUT, timeout=timeout_s)
    out = log.read_text(errors="replace")
    if p.returncode != 0:
        raise RuntimeError(f"drgym {' '.join(args)} exited with {p.returncode}:\n{out[-3000:]}")
    return out


def _node_names(cluster) -> dict[str, str]:
    return {v: k for k, v in cluster.node_ids().items()}  # node id -> node_a / node_b


def build_step(cluster, work: Path) -> dict:
    """Step 2: the Ray build across both nodes, placements, and the comparison with a local build."""
    from ray.util.state import list_actors, list_tasks

    from drgym.index.build import IndexSpec, build_index
    from test_index_scale import assert_same_index

    names = _node_names(cluster)
    t0 = time.perf_counter()
    out = _drgym(["index", "build", "--corpus", "hotpotqa", "--shard-size", str(SHARD_SIZE), "--chunk-docs",
                  str(CHUNK_DOCS), "--ray",
                  "--ray-address", cluster.address, "--root", str(work / "ray")], cluster, work / "build_ray.log",
                 env=WAIT_FOR_ACTORS)
    ray_s = time.perf_counter() - t0
    folder = Path(next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("index: ")))
    actors = [a for a in list_actors(address=cluster.dashboard_url, detail=True, limit=10000)
              if "UnitEncoder" in (a.class_name or "")]
    tasks = [t for t in list_tasks(address=cluster.dashboard_url, detail=True, limit=10000)
             if t.name == "_run_shard" and t.state == "FINISHED"]
    t0 = time.perf_counter()
    local = build_index(IndexSpec(corpus="hotpotqa", shard_size=SHARD_SIZE, chunk_docs=CHUNK_DOCS), root=work / "local")
    local_s = time.perf_counter() - t0
    try:
        assert_same_index(local.folder, folder)
        same, diff = True, None
    except AssertionError as e:
        same, diff = False, f"{type(e).__name__}: {e}"
    return {
        "command": f"RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S=600 drgym index build --corpus hotpotqa --shard-size "
                   f"{SHARD_SIZE} --chunk-docs {CHUNK_DOCS} --ray --ray-address HEAD --root ROOT/ray",
        "folder_name": folder.name,
        "output_line": next(line for line in out.splitlines() if line.startswith("built: ")),
        "wall_s": round(ray_s, 1),
        "local_build_wall_s": round(local_s, 1),
        "encoder_actors": [{"class": a.class_name, "node": names.get(a.node_id, a.node_id), "state": a.state,
                            "death_cause": None if a.node_id else str(a.death_cause)[:300]}
                           for a in actors],  # an actor Ray Data asked for but never needed has no node
        "shard_tasks_by_node": sorted(names.get(t.node_id, t.node_id) for t in tasks),
        "nodes_used_by_encoder_actors": sorted({names.get(a.node_id, a.node_id) for a in actors if a.node_id}),
        "equal_to_local_build": same,
        "difference": diff,
        "folder": str(folder),
    }


def _serve_actors(cluster) -> list[dict]:
    from ray.util.state import list_actors

    names = _node_names(cluster)
    return [{"class": a.class_name, "name": a.name, "node": names.get(a.node_id, a.node_id), "pid": a.pid,
             "actor_id": a.actor_id}
            for a in list_actors(address=cluster.dashboard_url, filters=[("state", "=", "ALIVE")], detail=True,
                                 limit=10000)
            if (a.class_name or "").startswith(("ServeReplica", "ServeController", "ProxyActor"))]


def _ask(url: str) -> dict:
    """Every request of the comparison, answers by request."""
    import httpx

    out = {}
    with httpx.Client(base_url=url, timeout=120) as c:
        for q in QUERIES:
            for path in ("/search", "/fineweb/search"):
                r = c.get(path, params={"query": q, "k": 10, "with_distance": True})
                out[f"GET {path} {q}"] = (r.status_code, r.json())
        r = c.post("/retrieve", json={"queries": QUERIES, "topk": 5, "return_scores": True})
        out["POST /retrieve"] = (r.status_code, r.json())
    return out


def _fetches(url: str, urls: list[str]) -> dict:
    import httpx

    with httpx.Client(base_url=url, timeout=120) as c:
        return {f"GET /fetch {u}": (lambda r: (r.status_code, r.json()))(c.get("/fetch", params={"url": u}))
                for u in urls}


def _hits(answers: dict) -> dict[str, list[tuple[str, float]]]:
    """(id, score) of every hit of every answer."""
    from drgym.search.wire import decode_b64_json

    out = {}
    for key, (_status, body) in answers.items():
        if key.startswith("GET /search") or key.startswith("GET /fineweb"):
            out[key] = [(decode_b64_json(x)["ClueWeb22-ID"], float(d))
                        for x, d in zip(body["results"], body.get("distances") or [])]
        elif key == "POST /retrieve":
            for q, hs in zip(QUERIES, body["result"]):
                out[f"retrieve {q}"] = [(h["document"]["id"], float(h["score"])) for h in hs]
    return out


def compare(a: dict, b: dict) -> dict:
    """Answers of two servers to the same requests: ids, scores, whole bodies."""
    ha, hb = _hits(a), _hits(b)
    same_ids = all([i for i, _ in ha[k]] == [i for i, _ in hb.get(k, [])] for k in ha) and ha.keys() == hb.keys()
    diffs = [abs(x - y) for k in ha if k in hb and len(ha[k]) == len(hb[k]) for (_, x), (_, y) in zip(ha[k], hb[k])]
    return {
        "requests": len(a),
        "hit_lists": len(ha),
        "hits": sum(len(v) for v in ha.values()),
        "all_status_200": all(s == 200 for s, _ in a.values()) and all(s == 200 for s, _ in b.values()),
        "same_ids_in_order": same_ids,
        "max_abs_score_diff": max(diffs) if diffs else None,
        "identical_json_bodies": sum(a[k] == b.get(k) for k in a),
        "partial_answers": sum("partial" in body for _, body in b.values() if isinstance(body, dict)),
    }


def _wait_line(proc: subprocess.Popen, log: Path, needle: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        for line in text.splitlines():
            if needle in line:
                return line
        if proc.poll() is not None:
            raise RuntimeError(f"drgym serve-ray exited with {proc.returncode}:\n{text[-3000:]}")
        time.sleep(1.0)
    raise TimeoutError(f"drgym serve-ray printed no {needle!r} within {timeout_s:g} s:\n{text[-3000:]}")


def serve_step(cluster, folder: Path, work: Path, kill: bool = True) -> dict:
    """Steps 3-5: serve-ray across both nodes against drgym serve, a shard killed, Ctrl-C."""
    import httpx
    import yaml

    from drgym.search.wire import decode_b64_json
    from server_helpers import free_port, running_server

    cfg = work / "two_nodes.yaml"
    cfg.write_text(yaml.safe_dump(TWO_NODE_CONFIG, sort_keys=False))
    port = free_port()
    log = work / "serve_ray.log"
    args = [sys.executable, "-m", "drgym", "serve-ray", "--index-dir", str(folder), "--ray-address", cluster.address,
            "--port", str(port), "--config", str(cfg)]
    rec: dict = {"command": "drgym serve-ray --index-dir FOLDER --ray-address HEAD --port PORT --config CONFIG",
                 "config": TWO_NODE_CONFIG}
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(args, env=_env(cluster), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_line(proc, log, "(Ctrl-C stops)", 600)
        rec["deploy_s"] = round(time.perf_counter() - t0, 1)
        url = f"http://127.0.0.1:{port}"
        actors = _serve_actors(cluster)
        rec["replicas"] = [{k: a[k] for k in ("class", "node", "pid")} for a in actors]
        shard_nodes = {a["class"].split(":")[1]: a["node"] for a in actors if a["class"].endswith(":ShardServer")}
        rec["shard_nodes"] = dict(sorted(shard_nodes.items()))
        rec["shards_on_different_nodes"] = len(set(shard_nodes.values())) == len(shard_nodes) == 2
        rec["health"] = httpx.get(url + "/health", timeout=60).json()["index"]
        ray_answers = _ask(url)
        with running_server(cli_args=["--index-dir", str(folder), *SINGLE_ARGS]) as single:
            local_answers = _ask(single.url)
            rec["encoder_backend"] = {"drgym serve": httpx.get(single.url + "/health").json()["engine"]["encoder_backend"],
                                      "drgym serve-ray": httpx.get(url + "/health").json()["engine"]["encoder_backend"]}
            urls = sorted({decode_b64_json(x)["URL"] for k, (_, body) in local_answers.items()
                           if k.startswith("GET /search") for x in body["results"]})
            local_answers.update(_fetches(single.url, urls))
        ray_answers.update(_fetches(url, urls))
        rec["fetched_urls"] = len(urls)
        rec["vs_drgym_serve"] = compare(local_answers, ray_answers)
        rec["fetch_bodies_equal"] = sum(ray_answers[k] == local_answers[k] for k in ray_answers if "/fetch" in k)
        if kill:
            rec["kill"] = kill_step(cluster, url, actors, ray_answers)
        proc.send_signal(signal.SIGINT)
        rec["ctrl_c_exit_status"] = proc.wait(timeout=120)
        for _ in range(30):  # the state API lists an actor ALIVE until the GCS hears of its end
            left = [a["class"] for a in _serve_actors(cluster)]
            if not left:
                break
            time.sleep(1.0)
        rec["serve_actors_alive_after_ctrl_c"] = left
        return rec
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _search_until_complete(cluster, url: str, victim: dict, timeout_s: float = 300, min_tries: int = 1) -> dict:
    """New ``/search`` queries (no cache hit) every half second until an answer is complete
    (no ``partial``) and the shard's replica is a new one (another PID); at least ``min_tries``."""
    import httpx

    t0 = time.perf_counter()
    seen = []
    n = 0
    while time.perf_counter() - t0 < timeout_s:
        q = f"{QUERIES[n % len(QUERIES)]} {time.time_ns()}"
        n += 1
        try:
            r = httpx.get(url + "/search", params={"query": q, "k": 5, "with_distance": True}, timeout=120)
            status, partial = r.status_code, (r.json().get("partial") if r.status_code == 200 else None)
        except httpx.TransportError as e:  # recorded (as not 200), not raised: the record says what the client saw
            status, partial = f"{type(e).__name__}: {e}", None
        seen.append({"status": status, "partial": partial, "after_s": round(time.perf_counter() - t0, 1)})
        if n >= min_tries and r.status_code == 200 and partial is None:
            new = [a for a in _serve_actors(cluster) if a["class"] == victim["class"]]
            if new and new[0]["pid"] != victim["pid"]:
                break
        time.sleep(0.5)
    new = [a for a in _serve_actors(cluster) if a["class"] == victim["class"]]
    return {
        "first_answer": seen[0],
        "answers": len(seen),
        "partial_answers": sum(1 for x in seen if x["status"] == 200 and x["partial"]),
        "partial_fields_seen": sorted({json.dumps(x["partial"]) for x in seen if x["partial"]}),
        "non_200": sum(1 for x in seen if x["status"] != 200),
        "complete_again_after_s": round(time.perf_counter() - t0, 1),
        "new_replica": [{"node": a["node"], "pid": a["pid"]} for a in new],
    }


def _same(before: dict, again: dict) -> bool:
    """The answers ``again`` (searched anew: the router's cache is off) equal ``before``'s."""
    return all(again[k] == before[k] for k in again)


def kill_step(cluster, url: str, actors: list[dict], before: dict) -> dict:
    """Step 4: SIGKILL the shard-1 replica's process, then the whole node of shard 1 (and a
    new node offering ``node_b`` started); answers while it is gone and after."""
    victim = next(a for a in actors if a["class"] == "ServeReplica:drgym-shard-1:ShardServer")
    os.kill(victim["pid"], signal.SIGKILL)
    replica = {"killed": {k: victim[k] for k in ("class", "node", "pid")},
               **_search_until_complete(cluster, url, victim)}
    replica["answers_after_equal_before"] = _same(before, _ask(url))

    victim = next(a for a in _serve_actors(cluster) if a["class"] == victim["class"])
    node = {"killed": "node_b: SIGKILL to every process of the worker node (ray start, raylet, agents, workers)",
            "marked_dead_after_s": round(cluster.kill_node(1), 1)}
    down = _search_until_complete(cluster, url, victim, timeout_s=12)  # no node offers node_b: partial answers
    node["while_down"] = {k: down[k] for k in ("answers", "partial_answers", "partial_fields_seen", "non_200")}
    t0 = time.perf_counter()
    cluster.add_node({"node_b": 1})
    node["new_node_started_s"] = round(time.perf_counter() - t0, 1)
    after = _search_until_complete(cluster, url, victim)
    node["complete_again_after_new_node_s"] = round(time.perf_counter() - t0, 1)
    node["after_new_node"] = after
    node["answers_after_equal_before"] = _same(before, _ask(url))
    return {"replica": replica, "node": node}


def run(work: Path, *, kill: bool = True) -> dict:
    """The whole experiment in ``work`` (index folders, logs); returns the record."""
    from ray_cluster import leftover_processes, local_cluster

    import ray

    rec: dict = {"ray_version": ray.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
                 "cluster": "2 nodes on one machine: `ray start --head --num-cpus 1 --resources '{\"node_a\": 1}'` and "
                            "`ray start --address HEAD --num-cpus 1 --resources '{\"node_b\": 1}'` (each --block, own "
                            "raylet and object store, token auth)"}
    t0 = time.perf_counter()
    with local_cluster([{"node_a": 1}, {"node_b": 1}], num_cpus=1) as cluster:
        rec["cluster_start_s"] = round(time.perf_counter() - t0, 1)
        rec["nodes"] = {k: v[:12] for k, v in sorted(cluster.node_ids().items())}
        rec["build"] = build_step(cluster, work)
        rec["serve"] = serve_step(cluster, Path(rec["build"]["folder"]), work, kill=kill)
    rec["cluster_processes_left"] = leftover_processes(cluster)
    rec["total_s"] = round(time.perf_counter() - t0, 1)
    rec["build"].pop("folder")
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON record to write")
    ap.add_argument("--work", type=Path, default=None, help="folder for the indexes and logs (default: a temp dir)")
    ap.add_argument("--no-kill", action="store_true", help="skip step 4 (the killed shard replica)")
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="drgym-ray2-"))
    work.mkdir(parents=True, exist_ok=True)
    rec = {"command": "python scripts/ray_two_nodes.py --out " + str(a.out), **run(work, kill=not a.no_kill)}
    from drgym.atomic import atomic_write_text

    atomic_write_text(a.out, json.dumps(rec, indent=2) + "\n")
    print(json.dumps(rec, indent=2))


if __name__ == "__main__":
    main()
