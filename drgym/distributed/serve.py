"""Sharded serving with Ray Serve, behind the same API as ``drgym serve``.

    drgym serve-ray --index-dir ~/.cache/drgym/indexes/wiki-18--e5-base-v2--IVF4096_PQ96 --port 8000

One Serve application per dense shard (:class:`ShardServer`: the shard's FAISS index,
memory-mapped, plus its float16 embeddings for exact re-ranking) and one router
application (:class:`Router`) serving :func:`drgym.server.app.create_app` over a
:class:`ShardedSearchEngine`: the same routes (``/search``, ``/fineweb/search``,
``/fetch``, ``/retrieve``, ``/health``), wire models and micro-batching as the
single-process server. The router encodes each query once, sends the vectors to every
shard in parallel, and merges the shards' top-k with
:func:`drgym.index.ranking.merge_shard_results`, the merge the local engine uses (score,
then passage_id), so the rankings equal the single-process server's. The docstore, BM25
and hybrid fusion stay in the router (they are per index, not per shard).

A shard that fails or does not answer within ``shard_timeout_s`` is left out: the answer
then holds the best hits of the other shards and a ``partial`` field naming the missing
shards (never a 500; only when no shard answers is it an error). Replicas and autoscaling
come from a YAML config (:data:`DEFAULT_CONFIG`, documented inline).

The shards search with :func:`drgym.index.search_params.search_params_for`, the rule of the local
engine and ``drgym serve`` (the config's ``search_params`` change its defaults as they do
there). The default config asks half a CPU per replica, so the router and two shards start
on a 2-core machine; :func:`check_fits` refuses, before deploying, a config whose minimum
replicas ask more CPUs or GPUs than the cluster has (Ray would leave them pending).
"""

from __future__ import annotations

import copy
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from drgym.config import merge_layers
from drgym.distributed import require_ray
from drgym.errors import BackendUnavailableError, ConfigError
from drgym.search.base import PartialResults
from drgym.search.local import LocalSearchEngine

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path(__file__).with_name("serve.yaml")


def load_config(path: str | Path | None = None, overrides: dict | None = None) -> dict[str, Any]:
    """The serving config: :data:`DEFAULT_CONFIG`, then the YAML file at ``path``, then
    ``overrides``, merged key by key. A ``num_replicas`` given in a later layer drops the
    ``autoscaling_config`` of an earlier one (Ray Serve takes one or the other).

    Raises:
        ConfigError: a file that is not a YAML mapping.
    """
    import yaml

    def read(p: Path) -> dict:
        try:
            d = yaml.safe_load(Path(p).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read serving config {p}: {e}") from e
        if not isinstance(d, dict):
            raise ConfigError(f"serving config {p} must be a YAML mapping.")
        return d

    cfg = read(DEFAULT_CONFIG)
    if path is not None:
        cfg = _merge(cfg, read(Path(path)))
    return _merge(cfg, overrides or {})


def _merge(a: dict, b: dict) -> dict:
    """``b`` merged over ``a`` key by key (a deep copy), by :func:`drgym.config.merge_layers`:
    a ``num_replicas`` in ``b`` drops the ``autoscaling_config`` of ``a`` and the other way round."""
    return copy.deepcopy(merge_layers(a, b, exclusive=[("num_replicas", "autoscaling_config")]))


RAY_DEFAULT_REPLICA_CPUS = 1.0
"""CPUs Ray Serve reserves for a replica whose ``ray_actor_options`` name none."""


def _min_replicas(deployment: dict) -> int:
    n = deployment.get("num_replicas")
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    return int((deployment.get("autoscaling_config") or {}).get("min_replicas", 1))


def shard_config(config: dict, shard_id: int) -> dict[str, Any]:
    """The ``shard`` section of ``config`` for one shard: its ``per_shard`` entry for
    ``shard_id`` (keyed by the shard number, an int or a string of one) merged over the
    rest of the section, key by key, as :func:`load_config` merges layers.

    Returns:
        The section without ``per_shard``.
    """
    sc = dict(config.get("shard") or {})
    per = sc.pop("per_shard", None) or {}
    own = per.get(shard_id, per.get(str(shard_id)))
    return _merge(sc, own) if own else sc


def check_per_shard(config: dict, n_shards: int) -> None:
    """Check that every key of ``shard.per_shard`` names a shard of the index.

    Raises:
        ConfigError: a key that is not a shard number below ``n_shards``, or an entry that
            is not a mapping.
    """
    per = (config.get("shard") or {}).get("per_shard") or {}
    if not isinstance(per, dict):
        raise ConfigError(f"shard.per_shard must map shard numbers to settings, got {type(per).__name__}.")
    for key, val in per.items():
        if str(key).strip().isdigit() and int(key) < n_shards and isinstance(val, dict):
            continue
        raise ConfigError(f"shard.per_shard[{key!r}]: the index has {n_shards} shard(s), numbered 0 to "
                          f"{n_shards - 1}, and each entry must be a mapping of shard settings.")


def min_resources(config: dict, n_shards: int) -> dict[str, float]:
    """Resources the minimum replicas of a serving config reserve: the router's plus
    ``n_shards`` shard applications' (each with its ``per_shard`` settings).

    Args:
        config: a config from :func:`load_config`.
        n_shards: dense shards of the index (one application each).

    Returns:
        ``{"CPU": cpus, "GPU": gpus}`` plus each custom resource named in a
        ``ray_actor_options.resources`` (e.g. ``{"node_a": 0.5}``); fractions allowed, as
        Ray counts them.
    """
    need: dict[str, float] = {"CPU": 0.0, "GPU": 0.0}
    parts = [config.get("router") or {}] + [shard_config(config, i) for i in range(int(n_shards))]
    for part in parts:
        dep = part.get("deployment") or {}
        opts = dep.get("ray_actor_options") or {}
        n = _min_replicas(dep)
        need["CPU"] += n * float(opts.get("num_cpus", RAY_DEFAULT_REPLICA_CPUS))
        need["GPU"] += n * float(opts.get("num_gpus", 0))
        for res, amount in (opts.get("resources") or {}).items():
            need[res] = need.get(res, 0.0) + n * float(amount)
    return need


def check_fits(config: dict, n_shards: int, available: dict[str, float]) -> dict[str, float]:
    """Check that the minimum replicas of ``config`` fit the cluster's resources.

    Args:
        config: a config from :func:`load_config`.
        n_shards: dense shards of the index.
        available: the cluster's resources (``ray.cluster_resources()``: ``CPU``, ``GPU``
            and the nodes' custom resources).

    Returns:
        What the minimum replicas reserve (:func:`min_resources`).

    Raises:
        ConfigError: they ask more of a resource than the cluster has (both numbers
            named), or ``shard.per_shard`` names a shard the index lacks.
    """
    check_per_shard(config, n_shards)
    need = min_resources(config, n_shards)
    for res, amount in need.items():
        have = float(available.get(res, 0))
        if amount > have + 1e-9:
            who = f"the serving config's minimum replicas (a router and {n_shards} shard(s))"
            if res in ("CPU", "GPU"):
                opt = "num_cpus" if res == "CPU" else "num_gpus"
                raise ConfigError(
                    f"{who} reserve {amount:g} {res}s, the Ray cluster has {have:g}: start it with more (drgym "
                    f"serve-ray --num-cpus, or `ray start --num-cpus`/`--num-gpus` on each node) or lower "
                    f"ray_actor_options.{opt} / replicas in --config.")
            raise ConfigError(
                f"{who} reserve {amount:g} of the custom resource {res!r}, the Ray cluster has {have:g}: start a node "
                f"that offers it (`ray start --resources '{{\"{res}\": 1}}'`) or change ray_actor_options.resources "
                "(or shard.per_shard) in --config.")
    return need


class ShardServer:
    """One dense shard of an index (a Ray Serve deployment).

    Args:
        folder: the index folder (on storage the replica's node can read).
        shard_id: which shard.
        search_params: changes to :data:`~drgym.index.search_params.DEFAULT_SEARCH_PARAMS`,
            fitted to the shard by :func:`~drgym.index.search_params.search_params_for` (as in
            the local engine).
        mmap: memory-map flat-coded FAISS files.
        gpu_shard, gpu_float16: GPU placement (as :class:`~drgym.index.dense.DenseIndex`);
            used when the replica sees GPUs (``ray_actor_options.num_gpus``).
        expect: the deployed build's
            :meth:`~drgym.index.manifest.IndexManifest.serving_fingerprint` (None: not
            checked); a replica started after the index was rebuilt refuses to load
            (:class:`~drgym.errors.IndexReplacedError`) instead of serving the new build's
            rows beside the router's old documents.
    """

    def __init__(self, folder: str, shard_id: int, search_params: dict | None = None, mmap: bool = True,
                 gpu_shard: bool = False, gpu_float16: bool = False, expect: str | None = None) -> None:
        from drgym.index.dense import DenseIndex
        from drgym.index.manifest import FolderPin, IndexManifest

        pin = FolderPin(folder)
        try:
            m = IndexManifest.read(folder)
            check_same_build(m, expect, folder, f"shard {shard_id}")
        except BaseException:
            pin.close()
            raise
        self._pin = pin
        self.shard_id = int(shard_id)
        if not 0 <= self.shard_id < len(m.shards):
            raise ConfigError(f"index {folder} has {len(m.shards)} shards, no shard {shard_id}.")
        self.dense = DenseIndex.from_manifest(folder, m, search_params=search_params, shard_ids=[self.shard_id],
                                              mmap=mmap, gpu_shard=gpu_shard, gpu_float16=gpu_float16)
        pin.check(f"shard {shard_id} finished loading")  # replaced while its files were opened

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` of this shard: float32 scores and int64 global rows, ``(nq, k)``."""
        return self.dense.search(np.asarray(queries, dtype=np.float32), int(k))


class _RemoteDense:
    """Stands in for :class:`~drgym.index.dense.DenseIndex` in the router: fans the query
    vectors out to the shard handles and merges their answers."""

    def __init__(self, handles: list, tie_rank: np.ndarray, timeout_s: float) -> None:
        self.handles = list(handles)
        self.tie_rank = tie_rank
        self.timeout_s = float(timeout_s)
        self._local = threading.local()

    @property
    def missing(self) -> list[int]:
        """Shards left out of this thread's searches since :meth:`reset`."""
        return sorted(getattr(self._local, "missing", set()))

    def reset(self) -> None:
        self._local.missing = set()

    def close(self) -> None:
        """Nothing to stop here: the shard actors hold the indexes (as :meth:`DenseIndex.close
        <drgym.index.dense.DenseIndex.close>` for the router's engine)."""

    def search(self, queries: np.ndarray, k: int, *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`DenseIndex.search <drgym.index.dense.DenseIndex.search>`; ``threads``
        is ignored (each shard searches in its own process with its own threads)."""
        from drgym.index.ranking import merge_shard_results

        q = np.ascontiguousarray(queries, dtype=np.float32)
        calls = [(i, h.search.remote(q, k)) for i, h in enumerate(self.handles)]
        parts_s, parts_r, missing = [], [], []
        for i, call in calls:
            try:
                s, r = call.result(timeout_s=self.timeout_s)
            except Exception as e:  # noqa: BLE001 - any shard failure makes the answer partial
                log.warning("shard %d did not answer (%s: %s); answering without it", i, type(e).__name__, e)
                missing.append(i)
                continue
            parts_s.append(np.asarray(s, dtype=np.float32))
            parts_r.append(np.asarray(r, dtype=np.int64))
        self._local.missing = getattr(self._local, "missing", set()) | set(missing)
        if len(missing) == len(self.handles):
            raise BackendUnavailableError(f"none of the {len(self.handles)} index shards answered within "
                                          f"{self.timeout_s:g} s.")
        return merge_shard_results(parts_s, parts_r, self.tie_rank, q.shape[0], k)


def check_same_build(m, expect: str | None, folder, who: str) -> None:
    """Refuse to serve a part of another build of the index than the one deployed.

    Args:
        m: the :class:`~drgym.index.manifest.IndexManifest` read by this replica.
        expect: :meth:`~drgym.index.manifest.IndexManifest.serving_fingerprint` of the
            manifest read at deploy time (None: not checked).
        folder: the index folder (named in the message).
        who: the replica, e.g. ``"shard 3"`` (named in the message).

    Raises:
        IndexReplacedError: the fingerprints differ (the index was rebuilt after the
            deployment and this replica started since).
    """
    from drgym.errors import IndexReplacedError

    if expect is not None and m.serving_fingerprint() != expect:
        raise IndexReplacedError(f"Index {folder} was rebuilt after serve-ray deployed it: {who} would serve the new "
                                 "build beside replicas of the old one. Deploy it again (drgym serve-ray) to serve the "
                                 "new index.")


class ShardedSearchEngine(LocalSearchEngine):
    """A :class:`~drgym.search.local.LocalSearchEngine` whose dense search runs on shard
    servers: encoding, BM25, hybrid fusion, docstore lookups and result building are the
    local engine's own code.

    Args:
        folder: the index folder.
        handles: one Ray Serve handle per shard, in shard order (anything with
            ``.search.remote(queries, k).result(timeout_s=...)``).
        shard_timeout_s: seconds to wait for each shard.
        expect: the deployed build's serving fingerprint, as :class:`ShardServer`'s.
        Other arguments as :class:`~drgym.search.local.LocalSearchEngine`.

    Results of a search that some shards missed are :class:`~drgym.search.base.PartialResults`.
    """

    name = "sharded"

    def __init__(self, folder: str | Path, handles: list, *, shard_timeout_s: float = 10.0, expect: str | None = None,
                 **kwargs) -> None:
        super().__init__(folder, **kwargs)
        try:
            check_same_build(self.manifest, expect, folder, "the router")
        except BaseException:
            self.close()
            raise
        if len(handles) != len(self.manifest.shards):
            raise ConfigError(f"index {folder} has {len(self.manifest.shards)} shards but {len(handles)} shard servers.")
        self._remote = _RemoteDense(handles, self._shared.tie_rank, shard_timeout_s)
        self._shared._dense = self._remote

    def search_batch(self, queries: list[str], k: int = 10, *, method: str | None = None,
                     collapse: str | None = None):
        """As :meth:`LocalSearchEngine.search_batch`; lists are
        :class:`~drgym.search.base.PartialResults` when shards were missing."""
        self._remote.reset()
        out = super().search_batch(queries, k, method=method, collapse=collapse)
        missing = self._remote.missing
        if missing:
            n = len(self._remote.handles)
            return [PartialResults(hits, missing_shards=missing, n_shards=n) for hits in out]
        return out

    def __repr__(self) -> str:
        m = self.manifest
        return (f"ShardedSearchEngine({m.name!r}, method={self.method!r}, collapse={self.collapse!r}, passages={m.n_passages}, "
                f"encoder={m.encoder!r}, factory={m.factory!r}, shards={len(m.shards)})")


class Router:
    """The router deployment: the drgym FastAPI app over a :class:`ShardedSearchEngine`
    (built in the replica, after the constructor, by Ray Serve's late-bound ingress).

    ``server`` holds :class:`~drgym.search.wire.ServerSettings` fields; the query encoder's
    (``encoder``, ``encoder_backend``, ``search_threads``) are used as ``drgym serve`` uses
    them, the dense search settings are the shards' (``shard.search_params``)."""

    def __init__(self, folder: str, shard_apps: list[str], method: str = "hybrid", server: dict | None = None,
                 shard_timeout_s: float = 10.0, expect: str | None = None) -> None:
        from ray import serve

        from drgym.search.wire import ServerSettings

        self.settings = ServerSettings(**(server or {}))
        handles = [serve.get_deployment_handle("ShardServer", app_name=a) for a in shard_apps]
        s = self.settings  # the query encoder's settings as `drgym serve` reads them (search_params go to the shards)
        kw = {"encoder_backend": s.encoder_backend, "search_threads": s.search_threads or None}
        if s.encoder:
            kw["encoder"] = s.encoder
        self.engine = ShardedSearchEngine(folder, handles, shard_timeout_s=shard_timeout_s, method=method,
                                          max_k=s.max_k, expect=expect, **kw)
        self.engine.encode_queries(["warm up"])  # load the encoder now, not on the first request

    def __serve_build_asgi_app__(self):
        from drgym.server.app import create_app

        return create_app(self.engine, self.settings, close_backend=True)


def deploy(folder: str | Path, config: dict | None = None, *, host: str = "127.0.0.1", port: int = 8000) -> str:
    """Deploy an index on the connected Ray cluster: the shard applications, then the
    router at ``/``.

    Args:
        folder: the index folder.
        config: a config from :func:`load_config` (None: the default).
        host, port: where Ray Serve's HTTP proxy listens.

    Returns:
        The base URL, e.g. ``http://127.0.0.1:8000``.

    Raises:
        DependencyNotInstalled: Ray is not installed.
        IndexNotFoundError, CorruptIndexError: no readable index at ``folder``.
        ConfigError: the config's minimum replicas do not fit the cluster (:func:`check_fits`).
    """
    ray = require_ray()
    from ray import serve

    from drgym.index.manifest import IndexManifest

    folder = str(Path(folder).expanduser().resolve())
    cfg = config or load_config()
    m = IndexManifest.read(folder)
    m.check_files(folder)
    built = m.serving_fingerprint()  # every replica, started now or restarted later, serves this build or none
    need = check_fits(cfg, len(m.shards), ray.cluster_resources())
    log.info("serve-ray: %d shard(s); minimum replicas reserve %g CPUs, %g GPUs", len(m.shards), need["CPU"], need["GPU"])
    serve.start(http_options={"host": host, "port": int(port)}, proxy_location=cfg.get("proxy_location") or None)
    prefix = cfg.get("prefix", "drgym")
    shard_apps = []
    for i in range(len(m.shards)):
        name = f"{prefix}-shard-{i}"
        sc = shard_config(cfg, i)
        dep = serve.deployment(ShardServer, name="ShardServer", **sc.get("deployment", {}))
        serve.run(dep.bind(folder, i, sc.get("search_params"), bool(sc.get("mmap", True)),
                           bool(sc.get("gpu_shard", False)), bool(sc.get("gpu_float16", False)), built),
                  name=name, route_prefix=None)
        shard_apps.append(name)
    r = cfg["router"]
    dep = serve.deployment(serve.ingress()(Router), name="Router", **r.get("deployment", {}))
    serve.run(dep.bind(folder, shard_apps, r.get("method", "hybrid"), r.get("server", {}),
                       float(cfg.get("shard_timeout_s", 10.0)), built), name=f"{prefix}-router", route_prefix="/")
    return f"http://{host}:{port}"


def shard_app_names(folder: str | Path, config: dict | None = None) -> list[str]:
    """Names of the shard applications :func:`deploy` creates for ``folder``."""
    from drgym.index.manifest import IndexManifest

    prefix = (config or load_config()).get("prefix", "drgym")
    return [f"{prefix}-shard-{i}" for i in range(len(IndexManifest.read(folder).shards))]


def undeploy(folder: str | Path, config: dict | None = None) -> list[str]:
    """Remove what :func:`deploy` put on the connected Ray cluster for ``folder``: its
    router and shard applications (the router first), then Ray Serve itself when no other
    application is left on the cluster (another deployment's applications stay).

    Args:
        folder: the index folder given to :func:`deploy`.
        config: the config given to :func:`deploy` (its ``prefix`` names the applications).

    Returns:
        The names of the applications deleted (empty when Serve is not running or none
        of them was deployed).
    """
    from ray import serve
    from ray.serve.exceptions import RayServeException

    cfg = config or load_config()
    ours = [f"{cfg.get('prefix', 'drgym')}-router", *shard_app_names(folder, cfg)]
    try:
        running = set(serve.status().applications)
    except RayServeException:  # no Serve instance on the cluster: nothing of ours to remove
        return []
    deleted = [name for name in ours if name in running]
    for name in deleted:
        serve.delete(name)
    if not running - set(deleted):
        serve.shutdown()
    return deleted
