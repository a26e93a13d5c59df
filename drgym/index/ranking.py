"""Ranking of dense candidates: coarse assignment, exact scores, tie ranks, the merge.

Every shard is searched, the candidates are merged by score and equal scores are
ordered by passage_id (which starts with the doc_id), so a ranking never depends on
the shard layout or on thread timing: :func:`merge_shard_results` (by
:func:`select_top`), the one merge of the local engine and of the sharded Ray Serve
router, orders ties by the ranks of ``dense/tie_rank.npy`` (:func:`write_tie_rank`,
:func:`load_tie_rank`). A query's scores come from :func:`exact_scores`, the same alone
and in any batch; IVF shards with a flat inner-product quantizer are assigned their
lists by :func:`coarse_assign` (per query, so also alike in any batch) and split into
probe groups by :func:`group_assign`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from drgym.errors import CorruptIndexError
from drgym.index.manifest import corrupt_file_error
from drgym.index.prealloc import open_memmap
from drgym.index.rows import DENSE_DIR

TIE_MARGIN = 16
"""Extra candidates fetched per shard so that exact score ties at the cut-off are
resolved by passage_id rather than by FAISS's internal order."""


def group_assign(assign: tuple[np.ndarray, np.ndarray], group: int, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """The lists of probe group ``group`` of ``groups`` (:data:`~drgym.index.search_params.PROBE_GROUPS_KEY`): of each
    query's assigned lists, those ranked ``group, group + groups, ...``, first, and list
    ``-1`` after them (FAISS skips it), so the shape stays ``(nq, nprobe)`` as
    ``search_preassigned`` needs; the padding's distances repeat the group's last one so
    that they stay inside the range FAISS quantizes.

    Args:
        assign: :func:`coarse_assign`'s ``(D, I)``, ``(nq, nprobe)`` each.
        group, groups: ``0 <= group < groups <= nprobe``.

    Returns:
        ``(D, I)`` of the same shapes and dtypes.

    >>> D = np.array([[0.9, 0.8, 0.7, 0.6, 0.5]], dtype=np.float32)
    >>> I = np.array([[4, 2, 7, 1, 3]])
    >>> [group_assign((D, I), g, 2)[1].tolist() for g in (0, 1)]
    [[[4, 7, 3, -1, -1]], [[2, 1, -1, -1, -1]]]
    """
    D, I = assign
    mine_d, mine_i = D[:, group::groups], I[:, group::groups]
    m = mine_i.shape[1]
    Dg = np.empty_like(D)
    Ig = np.full_like(I, -1)
    Ig[:, :m], Dg[:, :m] = mine_i, mine_d
    Dg[:, m:] = mine_d[:, -1:]
    return Dg, Ig


def coarse_assign(centroids: np.ndarray, q: np.ndarray, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``nprobe`` IVF lists of each query: those whose centroids have the largest
    inner products with it, best first, ties by list number.

    The one coarse search of drgym's IVF shards with a flat inner-product quantizer; the
    library, ``drgym serve`` and ``drgym serve-ray``'s shard servers all call it, so they
    probe the same lists, and shards cloned from one trained index (:func:`~drgym.index.faiss_build.write_trained`)
    are assigned once for all. Each query is scored alone (numpy's matrix-vector product,
    ``centroids @ q``), so a query probes the same lists alone and in any batch: FAISS's
    own assignment multiplies a batch at once, whose rounding depends on the batch. The
    cost is one matrix-vector product a query (it reads the ``nlist x dim`` centroids
    once a query), also in a batch.

    Args:
        centroids: float32 ``(nlist, dim)`` coarse centroids (inner-product quantizer).
        q: float32 ``(nq, dim)`` queries.
        nprobe: lists per query, ``1 <= nprobe <= nlist``.

    Returns:
        ``(D, I)``: float32 inner products and int64 list numbers, ``(nq, nprobe)``.

    >>> c = np.eye(3, dtype=np.float32)
    >>> coarse_assign(c, np.array([[0.1, 0.9, 0.5]], dtype=np.float32), 2)[1].tolist()
    [[1, 2]]
    """
    nlist = len(centroids)
    D = np.empty((len(q), nprobe), dtype=np.float32)
    I = np.empty((len(q), nprobe), dtype=np.int64)
    for i in range(len(q)):
        s = centroids @ q[i]
        top = np.argpartition(-s, nprobe - 1)[:nprobe] if nprobe < nlist else np.arange(nlist)
        d = s[top]
        order = np.lexsort((top, -d))
        I[i], D[i] = top[order], d[order]
    return D, I


EXACT_CHUNK = 64
"""Queries re-scored at a time by :func:`exact_scores` (bounds its float64 temporaries to
``EXACT_CHUNK * m * dim * 8`` bytes, 19.7 MB for ``m = 100`` and 384-d vectors)."""


def exact_scores(emb: np.ndarray, q: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Inner products of queries with stored vectors, the same on every path.

    Each score is the float32 rounding of a float64 sum of exact products (a float16 or
    float32 row times a float32 query is exact in float64), summed over the one row alone.
    So a query's scores do not depend on the batch it came in, the shard layout, the
    thread count, the BLAS build or the device: FAISS's own scores differ between these
    in the last bit (OpenBLAS picks its kernel by matrix size and CPU). Two summation
    orders could round differently only where the float64 sum lies within about 1e-16
    (relative) of a float32 rounding boundary.

    Args:
        emb: ``(count, dim)`` shard vectors, float16 (memory-mapped embeddings) or float32
            (an imported Flat index's own storage).
        q: float32 ``(nq, dim)`` queries.
        ids: int64 ``(nq, m)`` shard-local rows; ``-1`` entries get ``-inf``.

    Returns:
        float32 ``(nq, m)`` scores.
    """
    ok = ids >= 0
    out = np.full(ids.shape, -np.inf, dtype=np.float32)
    for a in range(0, ids.shape[0], EXACT_CHUNK):
        part, mask = ids[a:a + EXACT_CHUNK], ok[a:a + EXACT_CHUNK]
        flat = np.where(mask, part, 0).ravel()
        order = np.argsort(flat, kind="stable")  # sorted reads from the memory map
        vecs = np.empty((flat.size, emb.shape[1]), dtype=np.float64)
        vecs[order] = emb[flat[order]]
        vecs = vecs.reshape(part.shape[0], part.shape[1], -1)
        vecs *= np.asarray(q[a:a + EXACT_CHUNK], dtype=np.float64)[:, None, :]
        scores = vecs.sum(axis=2).astype(np.float32)
        out[a:a + EXACT_CHUNK] = np.where(mask, scores, -np.inf)
    return out


def write_tie_rank(folder: Path, rows_in_id_order, n: int) -> None:
    """Write ``dense/tie_rank.npy``: int64 ``(n,)``, the rank of each row's passage_id in
    sorted order.

    Args:
        folder: the index build folder.
        rows_in_id_order: iterable of the ``n`` rows sorted by passage_id
            (:meth:`drgym.docstore.DocStoreWriter.iter_rows_by_passage_id`).
        n: number of passages.

    Raises:
        CorruptIndexError: the iterable does not give each row once.
    """
    d = Path(folder) / DENSE_DIR
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / ".tie_rank.npy.tmp"
    rank = open_memmap(tmp, np.int64, (n,))  # disk space reserved: a full disk is ENOSPC, not SIGBUS
    rank[:] = -1
    i = 0
    buf: list[int] = []
    for r in rows_in_id_order:
        buf.append(r)
        if len(buf) == 1 << 20:
            rank[np.asarray(buf, dtype=np.int64)] = np.arange(i, i + len(buf), dtype=np.int64)
            i += len(buf)
            buf = []
    if buf:
        rank[np.asarray(buf, dtype=np.int64)] = np.arange(i, i + len(buf), dtype=np.int64)
        i += len(buf)
    ok = i == n and (n == 0 or int(rank.min()) >= 0)
    rank.flush()
    del rank
    if not ok:
        tmp.unlink()
        raise CorruptIndexError(f"tie ranks cover {i} rows, expected each of {n} rows once.")
    os.replace(tmp, d / "tie_rank.npy")


def load_tie_rank(folder: Path, n: int) -> np.ndarray:
    """Load ``dense/tie_rank.npy`` (int64 ``(n,)``, memory-mapped).

    Raises:
        CorruptIndexError: missing, unreadable or of the wrong length.
    """
    p = Path(folder) / DENSE_DIR / "tie_rank.npy"
    try:
        rank = np.load(p, mmap_mode="r")  # 8 bytes a row: shared page cache, not private memory
    except (OSError, ValueError, EOFError) as e:
        raise corrupt_file_error(p, f"is unreadable ({e})", folder) from e
    if rank.shape != (n,) or rank.dtype != np.int64:
        raise corrupt_file_error(p, f"holds {rank.dtype} of shape {rank.shape}, expected int64 ({n},)", folder)
    return rank


def select_top(scores: np.ndarray, rows: np.ndarray, tie_rank: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best ``k`` candidates of one query: by score descending, ties by passage_id.

    Args:
        scores: float ``(m,)`` candidate scores (higher is better).
        rows: int64 ``(m,)`` global rows; ``-1`` marks padding and is dropped.
        tie_rank: int64 ``(n_passages,)`` from :func:`write_tie_rank`.
        k: how many to keep.

    Returns:
        ``(scores, rows)`` of at most ``k`` candidates, best first.
    """
    keep = rows >= 0
    scores, rows = scores[keep], rows[keep]
    if len(rows) == 0:
        return scores, rows
    # Duplicated rows (possible with approximate indexes) keep their best score.
    order = np.lexsort((tie_rank[rows], -scores))
    rows, scores = rows[order], scores[order]
    _, first = np.unique(rows, return_index=True)
    if len(first) != len(rows):
        sel = np.sort(first)
        rows, scores = rows[sel], scores[sel]
    return scores[:k], rows[:k]


def merge_shard_results(parts_s: list[np.ndarray], parts_r: list[np.ndarray], tie_rank: np.ndarray, nq: int,
                        k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard candidates into the top ``k`` of each query (:func:`select_top`:
    score descending, ties by passage_id): the one merge of the local engine and of the
    sharded Ray Serve router, so both rank alike.

    Args:
        parts_s: per shard, float32 ``(nq, m_i)`` scores.
        parts_r: per shard, int64 ``(nq, m_i)`` global rows (``-1`` padding).
        tie_rank: int64 ``(n_passages,)`` passage_id ranks.
        nq: number of queries.
        k: results per query.

    Returns:
        ``(scores, rows)`` of shape ``(nq, k)``, padded with ``-inf`` / ``-1``.
    """
    out_s = np.full((nq, k), -np.inf, dtype=np.float32)
    out_r = np.full((nq, k), -1, dtype=np.int64)
    if not parts_s:
        return out_s, out_r
    all_s, all_r = np.concatenate(parts_s, axis=1), np.concatenate(parts_r, axis=1)
    for i in range(nq):
        sc, rw = select_top(all_s[i], all_r[i], tie_rank, k)
        out_s[i, : len(sc)] = sc
        out_r[i, : len(rw)] = rw
    return out_s, out_r
