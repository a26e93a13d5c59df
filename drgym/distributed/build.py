"""Distributed index build with Ray Data: :class:`RayRunner`.

    from drgym.index import IndexSpec, build_index
    from drgym.distributed.build import RayRunner

    build_index(IndexSpec(corpus="/data/wiki-18.jsonl", encoder="intfloat/e5-base-v2"),
                runner=RayRunner(address="auto"))

or ``drgym index build --corpus /data/wiki-18.jsonl --ray --ray-address auto``.

The build is :func:`drgym.index.build.build_index` with the two heavy steps moved to
the cluster; planning, the lock, resumption, the docstore and the manifest stay in the
driver, so the index folder is the one a local build writes:

1. Units (:mod:`drgym.index.units`: byte ranges of JSONL files, parquet row groups) form
   a Ray Dataset, one row a unit, read lazily: each unit is read from its corpus shard,
   split and embedded by :func:`drgym.index.units.encode_unit` inside an actor of a
   ``map_batches`` actor pool that keeps the encoder loaded (one actor per GPU when the
   cluster has GPUs, else one per CPU by default). A unit is one ``encode`` call in both
   builds, so the encoder sees the same batches and gives the same vectors.
2. The driver takes the encoded units back in order (``preserve_order``) and commits each
   to the docstore and to its embedding part, exactly as the local build does; a killed
   Ray build resumes like a local one.
3. Each dense shard (memory-mapped embeddings -> FAISS index) is a Ray task, the tasks
   spread over the nodes.

The corpus and the build folder must be on storage every node can read (and, for step 3,
write): a shared filesystem (NFS, Lustre, a mounted bucket), as DeepResearchGym's shards
are. The encoder must be loadable by name on every node (same pip packages or HF cache).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import numpy as np

from drgym.distributed import require_ray
from drgym.errors import ConfigError, IndexMismatchError
from drgym.index.build import BuildContext, ShardTask
from drgym.index.manifest import ShardInfo
from drgym.index.units import EncodedUnit, Unit, encode_unit

log = logging.getLogger(__name__)


class UnitEncoder:
    """Ray Data actor: loads the encoder once, then reads, splits and embeds units.

    Args:
        encoder: encoder name or path, as given to the build.
        device: ``"cpu"`` or ``"cuda"``.
        max_tokens, overlap: chunking settings.
        threads: torch intra-op threads (None keeps Ray's setting, one per CPU asked).
    """

    def __init__(self, encoder: str, device: str, max_tokens: int, overlap: int, threads: int | None = None) -> None:
        import torch

        from drgym.index.build import get_encoder

        if threads:
            torch.set_num_threads(int(threads))
        self.encoder = get_encoder(encoder, device)
        self.max_tokens, self.overlap = max_tokens, overlap

    def __call__(self, batch: dict) -> dict:
        out = {"no": [], "docs": [], "passages": [], "vectors": [], "n_live": [], "revision": [], "skipped": []}
        for raw in batch["unit"]:
            unit = Unit.from_dict(json.loads(raw))
            eu = encode_unit(unit, self.encoder, max_tokens=self.max_tokens, overlap=self.overlap)
            out["no"].append(eu.no)
            out["docs"].append(json.dumps([d.to_dict() for d in eu.docs], ensure_ascii=False))
            out["passages"].append(json.dumps([[p.passage_id, p.doc_id, p.title, p.text] for p in eu.passages],
                                              ensure_ascii=False))
            out["vectors"].append(np.ascontiguousarray(eu.vectors, dtype=np.float32).tobytes())
            out["n_live"].append(eu.n_live)
            out["revision"].append(self.encoder.revision)
            out["skipped"].append(json.dumps(eu.skipped_no_text))
        return {k: np.asarray(v, dtype=object) if k in ("docs", "passages", "vectors", "revision", "skipped")
                else np.asarray(v)
                for k, v in out.items()}


def _decode(row: dict, dim: int) -> EncodedUnit:
    from drgym.corpus.chunking import Passage
    from drgym.types import Document

    docs = [Document.from_dict(d) for d in json.loads(row["docs"])]
    passages = [Passage(*p) for p in json.loads(row["passages"])]
    vecs = np.frombuffer(row["vectors"], dtype=np.float32).reshape(len(passages), dim)
    return EncodedUnit(int(row["no"]), docs, passages, vecs, int(row["n_live"]), json.loads(row["skipped"]))


def _run_shard(task: ShardTask) -> ShardInfo:
    return task.run()


class RayRunner:
    """Encode a build's units with Ray Data and build its shards as Ray tasks.

    Args:
        address: Ray cluster address (``"auto"``, ``"ray://host:10001"``); None joins a
            running local cluster or starts one (with ``num_cpus``).
        num_cpus: CPUs of a cluster started here (None: all).
        encoder_actors: size of the encoder actor pool (None: one per GPU when the
            cluster has GPUs, else one per CPU).
        encoder_threads: torch threads per CPU actor (None: Ray's default, 1).
        shard_cpus: CPUs asked for each FAISS shard task.
        init_kwargs: further ``ray.init`` arguments (e.g. ``object_store_memory``).

    A cluster started by the runner is shut down by :meth:`close`.
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None, encoder_actors: int | None = None,
                 encoder_threads: int | None = None, shard_cpus: float = 1, init_kwargs: dict | None = None) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self.encoder_actors = encoder_actors
        self.encoder_threads = encoder_threads
        self.shard_cpus = shard_cpus
        self.init_kwargs = dict(init_kwargs or {})
        self._started = False

    def _ray(self):
        ray = require_ray()
        if not ray.is_initialized():
            kw = {"include_dashboard": False, "log_to_driver": False, **self.init_kwargs}
            if self.address is None and self.num_cpus is not None:
                kw["num_cpus"] = self.num_cpus
            ray.init(address=self.address, **kw)
            self._started = True
        return ray

    def close(self) -> None:
        """Shut down the Ray cluster if this runner started it."""
        if self._started:
            require_ray().shutdown()
            self._started = False

    def encode_units(self, units: list[Unit], ctx: BuildContext) -> Iterator[EncodedUnit]:
        """Encoded units in the order of ``units`` (see the module docstring)."""
        if not units:
            return
        if any(u.kind == "memory" for u in units):
            raise ConfigError("a Ray build reads corpus files or named corpora; documents handed in memory "
                              "(docs=) are built locally.")
        ray = self._ray()
        import ray.data

        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        n_actors = self.encoder_actors or max(1, gpus or int(resources.get("CPU", 1)))
        n_actors = min(n_actors, len(units))
        dctx = ray.data.DataContext.get_current()
        dctx.execution_options.preserve_order = True  # units come back in corpus order
        dctx.enable_progress_bars = bool(ctx.progress)
        if not ctx.progress:
            logging.getLogger("ray.data").setLevel(logging.WARNING)
        ds = ray.data.from_items([{"unit": json.dumps(u.to_dict())} for u in units], override_num_blocks=len(units))
        ds = ds.map_batches(
            UnitEncoder,
            fn_constructor_kwargs={"encoder": ctx.encoder_spec or ctx.encoder.name, "device": "cuda" if gpus else "cpu",
                                   "max_tokens": ctx.max_tokens, "overlap": ctx.overlap,
                                   "threads": self.encoder_threads},
            batch_size=1,
            # one unit in flight per actor: a unit is thousands of documents, so an actor that
            # comes up late still gets its share instead of the first one queueing them all
            compute=ray.data.ActorPoolStrategy(size=n_actors, max_tasks_in_flight_per_actor=1),
            num_gpus=1 if gpus else 0,
            num_cpus=1,
        )
        log.info("Ray build: %d units on %d encoder actor(s) (%s)", len(units), n_actors, "GPU" if gpus else "CPU")
        for row in ds.iter_rows():
            if row["revision"] != ctx.encoder.revision:
                raise IndexMismatchError(f"a Ray worker loaded encoder revision {row['revision']!r}, the driver "
                                         f"{ctx.encoder.revision!r}: install the same model on every node.")
            yield _decode(row, ctx.encoder.dim)

    def build_shards(self, tasks: list[ShardTask], progress: bool = False) -> list[ShardInfo]:
        """One Ray task per shard (``shard_cpus`` CPUs each), spread over the nodes (Ray's
        ``SPREAD`` strategy: Ray's default packs tasks onto the driver's node first);
        results in shard order."""
        ray = self._ray()
        remote = ray.remote(num_cpus=self.shard_cpus, scheduling_strategy="SPREAD")(_run_shard)
        return ray.get([remote.remote(t) for t in tasks])
