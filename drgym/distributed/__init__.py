"""drgym across machines, on Ray (``pip install 'drgym[distributed]'``).

* :mod:`drgym.distributed.build`: :class:`~drgym.distributed.build.RayRunner`, the
  runner of :func:`drgym.index.build.build_index` that encodes the corpus units with Ray
  Data (an actor pool running the encoder, GPU actors where the cluster has GPUs) and
  builds the FAISS shards as Ray tasks. It writes the same files as the local build.
* :mod:`drgym.distributed.serve`: sharded serving with Ray Serve, one application per
  dense shard and a router holding the encoder, docstore and BM25 behind the same
  FastAPI app as ``drgym serve`` (:func:`drgym.server.app.create_app`).

Ray is imported only here, and only when used: the core install stays light.
"""

from __future__ import annotations

RAY_VERSION = "2.60.0"
"""The Ray version the ``distributed`` extra pins (the one the tests ran with)."""


def require_ray():
    """Import and return ``ray``.

    Raises:
        DependencyNotInstalled: Ray is not installed (the message gives the pip command).
    """
    from drgym.errors import DependencyNotInstalled

    try:
        import ray
    except ImportError as e:
        raise DependencyNotInstalled(
            f"Ray is not installed; install drgym's distributed extra: pip install 'drgym[distributed]' "
            f"(ray[data,serve]=={RAY_VERSION})") from e
    return ray
