"""How drgym's index scales: build, size, memory, latency and recall from 10^5 passages up.

    OMP_NUM_THREADS=1 python scripts/bench_scale.py --sizes 100000 1000000 5000000 --hnsw-max 0 \\
        --bm25-max 5000000 --budget 30 --out scripts/results/bench_scale_fastscan.json
    python scripts/bench_scale.py --table scripts/results/bench_scale_fastscan.json    # the docs' tables
    python scripts/bench_scale.py --sizing scripts/results/bench_scale_fastscan.json
    OMP_NUM_THREADS=1 python scripts/bench_scale.py --sizes 100000 1000000 --hnsw-max 0 --bm25-max 0 \
        --budget 20 --keep --out scripts/results/bench_scale_questions.json   # with question-like queries
    python scripts/bench_scale.py --validate-questions scripts/results/bench_scale_questions_validation.json

For each size N, in this order, each stage in its own subprocess (so its peak RSS is its
own, read from ``getrusage``):

1. ``gen``: N passages of synthetic text in wiki-18 layout (``{"id", "contents"}``,
   100 words a passage drawn from a Zipf(1.1) vocabulary of 50,000 pseudo-words) and N
   synthetic unit vectors (dim 384, float16 ``.npy`` shards of 10^6 rows), plus 200
   queries and their exact top-10 (inner product on the stored float16 values, computed
   chunk by chunk while generating). The vectors are a topic mixture fitted to real
   MiniLM embeddings: the mean and covariance of the 21,123 vectors drgym ships
   (``drgym/data/embeddings``), N/32 topic centres drawn from that Gaussian, and each
   passage = normalise(mean + centre + 0.8 * noise of the same covariance); queries are
   fresh draws from random topics. Its median nearest-neighbour cosine (~0.69) is near
   the real one on wiki-default (0.63); uniform random vectors would have none of that
   structure and make every ANN index look worse than on real data. But a generated
   query's neighbours are a tight cluster (top-1 / 10th cosine 0.69 / 0.64), and a real
   question's are not (NQ-open dev on wiki-default: 0.50 / 0.36), so gen also makes 200
   question-like queries (:func:`question_like`: answer passages of the corpus moved by
   noise whose size :func:`fit_question_noise` fits to that profile at wiki-default's size)
   with their exact top-10; ``--validate-questions`` checks them against real questions'
   recall there.
2. ``import``: ``drgym index import --embeddings`` with factory Flat and no BM25: the
   encoder is bypassed, the rest is the real streamed build (docstore filled unit by
   unit, fingerprint, tie ranks, float16 embedding shards). Shards of ``--shard-size``
   rows (2.5M by default, so the 5M index has 2 shards, as a 24 GB machine should).
3. ``dense`` per factory (``Flat``, ``HNSW32`` up to ``--hnsw-max``, ``IVF{nlist},PQ48``
   as ``auto`` picks it): the FAISS shards built from the memory-mapped embeddings, the
   code path of a real build.
4. ``search`` per factory and search setting: single queries and batches of 64 at
   k=10 through :class:`drgym.index.dense.DenseIndex` (shard merge and tie-break
   included; FAISS files memory-mapped for flat codes), p50/p99 latency, recall@10 vs
   exact, for the generated queries and (``questions``) the question-like ones. drgym's defaults for an index without a measured nprobe (efSearch 64; nprobe
   ``max(16, nlist/4)``; exact re-rank of 100 IVF-PQ candidates; several shards searched
   side by side on ``shard_workers`` threads, one per shard up to the usable cores), and
   for IVF-PQ also nprobe 16, no re-rank and, with several shards, the shards searched in
   turn (``shard_workers=1``). The ``alt-*`` layouts are not calibrated:
   ``scripts/bench_calibrate.py`` measures the nprobe a build records.
   With ``--curve``, IVF-PQ alone over the grid nprobe x re-rank depth
   (:data:`CURVE_NPROBE` x :data:`CURVE_RERANK`): the recall/latency curve.
5. ``bm25`` for N <= ``--bm25-max`` (before the dense stages): drgym's BM25 built
   streaming over the docstore into the index folder: time, peak memory, passage-term
   pairs; then ``text_search``: BM25 latency, and hybrid latency (dense + BM25 fused by
   RRF, as ``method="hybrid"``) with IVF-PQ and with the index ``auto`` picks at that
   size, over 200 four-word queries (:func:`query_texts`).

Above ``--flat-max`` passages the import builds IVF-PQ and no ``Flat`` index is
measured (its file would not fit on the disk at 2.1x10^7); the exact top-10 comes from
the gen stage either way. Each stage also reports ``peak_private_mb``, its peak private
memory (:class:`PrivatePeak`), the figure to size a machine by; ``--sizing`` prints the
sizing table (per 10^6 passages, and wiki-18).

Timings are wall-clock on whatever machine runs it; the load average is recorded with
every stage. The JSON is rewritten after each stage, so a long run can be read (and a
killed one keeps what it measured). Growth is fitted as ``y = a * N**b`` on the sizes
measured (``fits``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DIM = 384
CURVE_NPROBE = (16, 32, 64, 128, 256)
CURVE_RERANK = (100, 300, 1000)
"""The ``--curve`` grid: IVF lists probed x IVF-PQ candidates re-scored exactly."""
N_QUERIES = 200
K = 10
SEED = 0
SHARD_ROWS = 1_000_000  # rows per generated .npy file
VOCAB = 50_000
WORDS = 100
QUERY_WORDS = 4
QUERY_RANKS = (200, 20_000)
"""BM25 queries: 4 words from vocabulary ranks 200..20,000 (see :func:`query_texts`)."""


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_now() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "RssAnon", "RssFile", "VmHWM")):
                k, v = line.split(":")
                out[k] = round(int(v.split()[0]) / 1024, 1)
    return out


class PrivatePeak:
    """The peak of this process's private memory (``RssAnon``, MB), sampled every 0.2 s
    in a daemon thread: what a machine must have in RAM for the stage. ``ru_maxrss``
    (``peak_rss_mb``) also counts the pages of memory-mapped files it touched, which the
    system can drop, so it overstates what is needed."""

    def __init__(self) -> None:
        import threading

        self.peak = rss_now().get("RssAnon", 0.0)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_now().get("RssAnon", 0.0))
            time.sleep(0.2)


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def pct(xs, q) -> float:
    return round(float(np.percentile(np.asarray(xs), q)), 3)


# -- stage: gen ---------------------------------------------------------------------------


def query_texts(words: np.ndarray, p: np.ndarray) -> list[str]:
    """:data:`N_QUERIES` BM25 query strings of :data:`QUERY_WORDS` pseudo-words each, drawn
    with the corpus's Zipf frequencies from ranks :data:`QUERY_RANKS` (content words: not
    the few hundred that occur in most passages, not the rare tail). A generator of its
    own (seed ``SEED + 1``), so that the passages and vectors are those of earlier runs."""
    rng = np.random.default_rng(SEED + 1)
    lo, hi = QUERY_RANKS
    w = p[lo:hi] / p[lo:hi].sum()
    return [" ".join(words[lo + rng.choice(hi - lo, size=QUERY_WORDS, replace=False, p=w)]) for _ in range(N_QUERIES)]


def topic_mixture(n: int, rng: np.random.Generator):
    """The synthetic vector model (see the module docstring): ``draw(m)`` gives ``m`` float16
    unit vectors ``(m, 384)`` from N/32 topic centres around the mean and covariance of
    drgym's shipped MiniLM vectors. The centres are drawn from ``rng`` first, then each
    ``draw`` call takes its topics and noise from it, in call order."""
    real = np.load(REPO / "drgym/data/embeddings/all-MiniLM-L6-v2-53aa51172d142c89/vectors.npy").astype(np.float32)
    mu = real.mean(0)
    chol = np.linalg.cholesky(np.cov(real - mu, rowvar=False) + 1e-6 * np.eye(DIM)).astype(np.float32)
    n_topics = max(1, n // 32)
    centers = (rng.standard_normal((n_topics, DIM), dtype=np.float32) @ chol.T)

    def draw(m: int) -> np.ndarray:
        t = rng.integers(0, n_topics, m)
        x = mu + centers[t] + 0.8 * (rng.standard_normal((m, DIM), dtype=np.float32) @ chol.T)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)

    draw.mu, draw.chol = mu, chol  # for question_like
    return draw


QUESTION_PROFILES = {"nq-open-dev": (0.499, 0.355), "hipporag": (0.598, 0.390)}
"""Median top-1 and 10th-neighbour cosines of real questions over wiki-default's 21,123 MiniLM
vectors (NQ-open dev and HippoRAG questions, encoded as drgym serves them). A generated query
of the topic mixture sits at 0.69 / 0.64: a tight cluster, then a cliff; a question is farther
from its neighbours and they decay smoothly, so they spread over more IVF lists."""
QUESTION_PROFILE = "nq-open-dev"
"""The profile the ``questions`` set of every size is generated to (the harder of the two)."""
REAL_N = 21_123


def question_like(anchors: np.ndarray, mu: np.ndarray, chol: np.ndarray, noise: float, shift: float,
                  rng: np.random.Generator) -> np.ndarray:
    """Question-like query vectors ``(m, 384)`` float32: each a passage of the corpus (``anchors``,
    its answer passage) moved by ``noise`` times a unit vector of the corpus's covariance shape
    and by ``shift`` along the mean direction, then normalised."""
    u = rng.standard_normal((len(anchors), DIM), dtype=np.float32) @ chol.T
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    q = anchors.astype(np.float32) + noise * u + shift * (mu / np.linalg.norm(mu))
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def fit_question_noise(profile: str = QUESTION_PROFILE) -> dict:
    """``noise`` and ``shift`` of :func:`question_like` that give, on a topic-mixture corpus of
    wiki-default's size (:data:`REAL_N`), the median top-1 / 10th cosines real questions have on
    wiki-default (:data:`QUESTION_PROFILES`): a grid search, deterministic (own seed), a few
    seconds. The same two numbers then make the questions at every size."""
    rng = np.random.default_rng(SEED + 3)
    draw = topic_mixture(REAL_N, rng)
    x = draw(REAL_N).astype(np.float32)
    mu, chol = draw.mu, draw.chol
    want = QUESTION_PROFILES[profile]
    best = None
    for noise in np.arange(1.0, 2.21, 0.1):
        for shift in np.arange(-0.6, 1.01, 0.2):
            q = question_like(x[np.random.default_rng(SEED + 4).integers(0, REAL_N, N_QUERIES)], mu, chol,
                              float(noise), float(shift), np.random.default_rng(SEED + 5))
            top = -np.sort(np.partition(-(q @ x.T), K - 1, axis=1)[:, :K], axis=1)
            got = (float(np.median(top[:, 0])), float(np.median(top[:, K - 1])))
            err = (got[0] - want[0]) ** 2 + (got[1] - want[1]) ** 2
            if best is None or err < best[0]:
                best = (err, float(noise), float(shift), got)
    return {"profile": profile, "target_top1_10th": list(want), "noise": round(best[1], 3), "shift": round(best[2], 3),
            "fitted_top1_10th": [round(best[3][0], 4), round(best[3][1], 4)], "fitted_on_n": REAL_N}


def validate_questions() -> dict:
    """The question-like queries against what real questions do at wiki-default's size: on a
    topic-mixture corpus of :data:`REAL_N` vectors, the IVF-PQ layout ``auto`` picks there, at
    nprobe 16, nlist/4 and nlist, with drgym's exact re-rank of 100 candidates (and 300, 1000),
    recall@10 of the generated queries and of the question-like ones, to set beside the recall real questions
    get on wiki-default itself with the same layout and rule (NQ-open dev 0.853, generated 0.993)."""
    import faiss

    rng = np.random.default_rng(SEED + 3)
    draw = topic_mixture(REAL_N, rng)
    x = draw(REAL_N).astype(np.float32)
    qfit = fit_question_noise()
    qr = np.random.default_rng(SEED + 6)
    sets = {"generated": draw(N_QUERIES).astype(np.float32),
            "questions": question_like(x[qr.choice(REAL_N, N_QUERIES, replace=False)], draw.mu, draw.chol,
                                       qfit["noise"], qfit["shift"], qr)}
    factory = ivfpq(REAL_N, REAL_N)
    idx = faiss.index_factory(DIM, factory, faiss.METRIC_INNER_PRODUCT)
    idx.train(x)
    idx.add(x)
    # the real thing: wiki-default's shipped MiniLM vectors, NQ-open dev questions encoded as drgym serves them
    from drgym.embedding import Encoder

    real = np.load(REPO / "drgym/data/embeddings/all-MiniLM-L6-v2-53aa51172d142c89/vectors.npy").astype(np.float32)
    real /= np.linalg.norm(real, axis=1, keepdims=True)
    encoder = Encoder()
    nq = [json.loads(line)["question"] for line in
          (REPO / "drgym/data/tasks/nq_open_dev_200.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    real_idx = faiss.index_factory(DIM, factory, faiss.METRIC_INNER_PRODUCT)
    real_idx.train(real)
    real_idx.add(real)
    out = {"n": REAL_N, "factory": factory, "rerank": "100 unless named", "question_fit": qfit,
           "real": {"vectors": "wiki-default (drgym/data/embeddings)", "queries": "nq_open_dev_200.jsonl",
                    "encoder_backend": encoder.backend}, "recall@10": {}}
    runs = [(name, q, x, idx) for name, q in sets.items()]
    runs.append(("real NQ-open on wiki-default", encoder.encode_queries(nq).astype(np.float32), real, real_idx))
    for name, q, x, idx in runs:
        ivf = faiss.extract_index_ivf(idx)
        exact = q @ x.T
        if name.startswith("real"):
            top = -np.sort(np.partition(-exact, K - 1, axis=1)[:, :K], axis=1)
            out["real"]["median_top1_10th"] = [round(float(np.median(top[:, 0])), 4), round(float(np.median(top[:, -1])), 4)]
        truth = np.argsort(-exact, axis=1)[:, :K]
        for nprobe in (16, ivf.nlist // 4, ivf.nlist):
            ivf.nprobe = nprobe
            for rerank in (100, 300, 1000):
                _, cand = idx.search(q, rerank)
                order = np.argsort(-np.take_along_axis(exact, cand, 1), axis=1)[:, :K]
                got = np.take_along_axis(cand, order, 1)
                key = f"{name} nprobe {nprobe}" + ("" if rerank == 100 else f" rerank {rerank}")
                out["recall@10"][key] = round(float(np.mean(
                    [len(set(got[i].tolist()) & set(truth[i].tolist())) / K for i in range(len(q))])), 4)
    return out


def corpus_file(work: Path) -> Path:
    """The generated corpus: ``corpus.jsonl``, or ``corpus.jsonl.gz`` where gen compressed it."""
    gz = work / "corpus.jsonl.gz"
    return gz if gz.exists() else work / "corpus.jsonl"


def stage_gen(n: int, work: Path, gz: bool = False) -> dict:
    """Synthetic corpus JSONL (gzip level 1 with ``gz``, for disk; the import reads a
    ``.jsonl.gz`` in spans too, decompressing it once), float16 vector shards, queries,
    exact top-10."""
    import gzip

    t0 = time.perf_counter()
    rng = np.random.default_rng(SEED)
    draw = topic_mixture(n, rng)

    queries = draw(N_QUERIES).astype(np.float32)
    # vocabulary: pseudo-words of 3-10 letters, Zipf(1.1) frequencies
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lens = rng.integers(3, 11, VOCAB)
    words = np.array(["".join(rng.choice(letters, size=L)) for L in lens])
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    p /= p.sum()

    work.mkdir(parents=True, exist_ok=True)
    best_s = np.full((N_QUERIES, K), -np.inf, np.float32)
    best_i = np.full((N_QUERIES, K), -1, np.int64)
    # question-like queries: own generators, so the passages and vectors are those of earlier runs
    qfit = fit_question_noise()
    qrng = np.random.default_rng(SEED + 2)
    questions = None
    qbest_s = np.full((N_QUERIES, K), -np.inf, np.float32)
    qbest_i = np.full((N_QUERIES, K), -1, np.int64)
    t_text = t_vec = t_gt = 0.0
    chunk = 100_000
    vec_files = []
    buf: list[np.ndarray] = []
    buf_rows = 0
    corpus = work / ("corpus.jsonl.gz" if gz else "corpus.jsonl")
    with (gzip.open(corpus, "wt", encoding="utf-8", compresslevel=1) if gz else open(corpus, "w", encoding="utf-8")) as f:
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            t = time.perf_counter()
            ids = rng.choice(VOCAB, size=(m, WORDS), p=p)
            lines = []
            for j in range(m):
                i = start + j
                lines.append(json.dumps({"id": str(i), "contents": f'"Synthetic passage {i}"\n' + " ".join(words[ids[j]])}))
            f.write("\n".join(lines) + "\n")
            t_text += time.perf_counter() - t
            t = time.perf_counter()
            v = draw(m)
            t_vec += time.perf_counter() - t
            t = time.perf_counter()
            if questions is None:  # answer passages from the first chunk (its topics are a random draw)
                questions = question_like(v[qrng.choice(m, N_QUERIES, replace=False)], draw.mu, draw.chol,
                                          qfit["noise"], qfit["shift"], qrng)
            best_s, best_i = _top_k_update(queries, v, start, best_s, best_i)
            qbest_s, qbest_i = _top_k_update(questions, v, start, qbest_s, qbest_i)
            t_gt += time.perf_counter() - t
            buf.append(v)
            buf_rows += m
            if buf_rows >= SHARD_ROWS or start + m == n:
                path = work / f"vectors-{len(vec_files):03d}.npy"
                np.save(path, np.concatenate(buf))
                vec_files.append(str(path))
                buf, buf_rows = [], 0
    np.save(work / "queries.npy", queries)
    np.save(work / "truth.npy", best_i)
    np.save(work / "questions.npy", questions)
    np.save(work / "questions_truth.npy", qbest_i)
    (work / "query_texts.json").write_text(json.dumps(query_texts(words, p)))
    nn_cos = float(np.median(best_s[:, 0]))
    return {"seconds": round(time.perf_counter() - t0, 1), "text_s": round(t_text, 1), "vectors_s": round(t_vec, 1),
            "exact_top10_s": round(t_gt, 1), "corpus_bytes": du(corpus), "corpus_file": corpus.name,
            "vector_bytes": sum(du(Path(p)) for p in vec_files), "vector_files": vec_files,
            "median_nn_cosine": round(nn_cos, 4), "median_10th_cosine": round(float(np.median(best_s[:, -1])), 4),
            "topics": max(1, n // 32),
            "questions": {**qfit, "median_nn_cosine": round(float(np.median(qbest_s[:, 0])), 4),
                          "median_10th_cosine": round(float(np.median(qbest_s[:, -1])), 4)},
            "peak_rss_mb": round(peak_rss_mb(), 1)}


def _top_k_update(q: np.ndarray, v: np.ndarray, start: int, best_s: np.ndarray, best_i: np.ndarray):
    """The exact top-:data:`K` of ``q`` over the rows seen so far, with chunk ``v`` (rows from ``start``)
    added: ``(scores, ids)``, each ``(len(q), K)``, best first."""
    s = q @ v.astype(np.float32).T
    alls = np.concatenate([best_s, s], axis=1)
    alli = np.concatenate([best_i, np.arange(start, start + len(v))[None, :].repeat(len(q), 0)], axis=1)
    part = np.argpartition(-alls, K - 1, axis=1)[:, :K]
    ps, pi = np.take_along_axis(alls, part, 1), np.take_along_axis(alli, part, 1)
    order = np.argsort(-ps, axis=1, kind="stable")
    return np.take_along_axis(ps, order, 1), np.take_along_axis(pi, order, 1)


# -- stage: import ------------------------------------------------------------------------


def stage_import(n: int, work: Path, shard_size: int, factory: str = "Flat") -> dict:
    """``drgym index import`` of the generated corpus and vectors. ``factory`` is the FAISS
    index the import builds: ``Flat`` (then deleted: the dense stage builds each factory)
    except above ``--flat-max``, where a Flat file (4 bytes a dimension) would not fit
    on the disk beside the rest; that IVF-PQ index is moved into the dense stage's folder
    and searched there, not built a second time."""
    from drgym.index.importer import import_index

    files = sorted(str(p) for p in work.glob("vectors-*.npy"))
    t = time.perf_counter()
    res = import_index(corpus_file(work), embeddings=files, encoder="synthetic-minilm-384", factory=factory,
                       shard_size=shard_size, bm25=False, name="bench", root=work / "indexes", force=True)
    secs = time.perf_counter() - t
    m = res.manifest
    folder = res.folder
    out = {"seconds": round(secs, 1), "factory": factory, "timings": m.timings, "n_passages": m.n_passages,
           "shards": len(m.shards),
           "docstore_bytes": du(folder / "docs.sqlite"),
           "embeddings_bytes": sum(du(folder / s.embeddings) for s in m.shards),
           "tie_rank_bytes": du(folder / "dense" / "tie_rank.npy"),
           "peak_rss_mb": round(peak_rss_mb(), 1)}
    if factory == "Flat":
        for s in m.shards:  # the dense stage rebuilds every factory the same way
            (folder / s.faiss).unlink()
    else:
        # an IVF-PQ import (above --flat-max) built the very files the dense stage would
        # build again (the same ShardTask and factory): move them into that stage's folder,
        # with the build time, so that it does not spend the FAISS step a second time
        alt = alt_folder(work, factory)
        (alt / "dense").mkdir(parents=True, exist_ok=True)
        for s in m.shards:
            (folder / s.faiss).rename(alt / s.faiss)
        (alt / IMPORT_BUILT).write_text(json.dumps({"seconds": m.timings.get("faiss"), "peak_rss_mb": out["peak_rss_mb"]}))
    for p in files:  # the embedding shards now hold the vectors; free the disk
        Path(p).unlink()
    corpus_file(work).unlink()
    return out


# -- stage: dense -------------------------------------------------------------------------


IMPORT_BUILT = "built_by_import.json"
"""In an alternative index folder: the import built its FAISS files (``{"seconds": ...}``)."""


OWN_QUANTIZERS = "+own"
"""Suffix of a factory label whose shards are each trained on their own rows (the layout
of indexes built before the shards shared one trained quantizer), for side-by-side runs."""


SHARD_SIZE_MARK = "+s"
"""Marks a factory label whose layout has its own shard size: ``IVF2048,PQ48x4fs+s21015324``
cuts the rows into shards of 21,015,324 rows (the float16 rows copied into the layout's own
embedding shards), clones of the trained index of the label without the mark when that
layout exists (so both probe the same lists), else of one trained on the same sample."""

ALT_SHARDS = "shards.json"
"""In an alternative index folder with its own shard size: its shards (``ShardInfo`` fields)."""


def alt_folder(work: Path, factory: str) -> Path:
    return work / "indexes" / ("alt-" + factory.replace(",", "_"))


def shard_size_of(factory: str) -> tuple[str, int | None]:
    """``(label without the shard-size mark, rows per shard or None)`` of a factory label."""
    base, mark, size = factory.rpartition(SHARD_SIZE_MARK)
    if mark and size.isdigit():
        return base, int(size)
    return factory, None


def alt_shards(work: Path, factory: str) -> list:
    """The dense shards of a layout: its own (:data:`SHARD_SIZE_MARK`), else the bench index's."""
    from drgym.index.manifest import IndexManifest, ShardInfo

    own = alt_folder(work, factory) / ALT_SHARDS
    if own.exists():
        return [ShardInfo(**d) for d in json.loads(own.read_text())]
    return IndexManifest.read(work / "indexes" / "bench").shards


def link_tie_rank(alt: Path, main: Path) -> None:
    """Link the bench index's ``dense/tie_rank.npy`` into an alternative layout (the rows are the same)."""
    link = alt / "dense" / "tie_rank.npy"
    if not link.exists():
        link.symlink_to(main / "dense" / "tie_rank.npy")


def stage_dense(work: Path, factory: str) -> dict:
    from drgym.index.build import ShardTask, shard_tasks
    from drgym.index.manifest import IndexManifest

    main = work / "indexes" / "bench"
    m = IndexManifest.read(main)
    alt = alt_folder(work, factory)
    (alt / "dense").mkdir(parents=True, exist_ok=True)
    if shard_size_of(factory)[1]:
        return _stage_dense_reshard(work, factory)
    for s in m.shards:  # reuse the float16 embedding shards: only the FAISS step runs
        link = alt / s.embeddings
        if not link.exists():
            link.symlink_to(main / s.embeddings)
    link_tie_rank(alt, main)
    built = alt / IMPORT_BUILT
    if built.exists() and all((alt / s.faiss).exists() for s in m.shards):
        b = json.loads(built.read_text())  # the import's FAISS step and the import's peak
        return {"factory": factory, "seconds": b["seconds"], "built_by": "import",
                "index_bytes": sum(du(alt / s.faiss) for s in m.shards), "peak_rss_mb": b["peak_rss_mb"]}
    t = time.perf_counter()
    parts = [(str(alt / s.embeddings), s.start, s.count) for s in m.shards]
    if factory.endswith(OWN_QUANTIZERS):  # each shard trained on its own rows, as before shared quantizers
        tasks = [ShardTask(str(alt), no, s.start, s.count, parts, m.dim, factory.removesuffix(OWN_QUANTIZERS))
                 for no, s in enumerate(m.shards)]
    else:
        tasks = shard_tasks(alt, m.n_passages, m.shard_size, parts, m.dim, factory)  # trains once for several shards
    train_s = time.perf_counter() - t
    per_shard = []
    for task in tasks:
        ts = time.perf_counter()
        task.run()
        per_shard.append(round(time.perf_counter() - ts, 1))
    secs = time.perf_counter() - t
    trained = [alt / tk.trained for tk in tasks[:1] if tk.trained]
    return {"factory": factory, "seconds": round(secs, 1), "seconds_per_shard": per_shard,
            "train_seconds": round(train_s, 1) if trained else None,
            "index_bytes": sum(du(alt / s.faiss) for s in m.shards) + sum(du(p) for p in trained),
            "peak_rss_mb": round(peak_rss_mb(), 1)}


def _stage_dense_reshard(work: Path, factory: str) -> dict:
    """:func:`stage_dense` for a layout of its own shard size (:data:`SHARD_SIZE_MARK`):
    copies the rows into its shards (or links those of another layout of the same shard
    size, which hold the same rows) and builds each from one trained index."""
    from dataclasses import asdict

    from drgym.atomic import atomic_write_json
    from drgym.index.build import ShardTask
    from drgym.index.faiss_build import TRAINED_FILE, write_trained
    from drgym.index.manifest import IndexManifest

    main = work / "indexes" / "bench"
    m = IndexManifest.read(main)
    alt = alt_folder(work, factory)
    base, size = shard_size_of(factory)
    link_tie_rank(alt, main)
    t = time.perf_counter()
    parts = [(str(main / s.embeddings), s.start, s.count) for s in m.shards]
    shared = alt_folder(work, base) / TRAINED_FILE
    if shared.exists() and not (alt / TRAINED_FILE).exists():
        shutil.copyfile(shared, alt / TRAINED_FILE)  # the same coarse quantizer as the base layout
    trained = write_trained(alt, parts, m.n_passages, m.dim, base)
    train_s = time.perf_counter() - t
    tasks = [ShardTask(str(alt), no, a, min(m.n_passages, a + size) - a, parts, m.dim, base, trained)
             for no, a in enumerate(range(0, m.n_passages, size))]
    linked = []
    for no in range(len(tasks)):  # the same rows in another layout of this shard size: no second copy
        emb = alt / f"dense/emb-{no:05d}.npy"
        for other in sorted((work / "indexes").glob(f"alt-*{SHARD_SIZE_MARK}{size}")):
            src = other / emb.relative_to(alt)
            if not emb.exists() and other != alt and src.exists() and not src.is_symlink():
                emb.symlink_to(src)
                linked.append(str(src.relative_to(work)))
    per_shard, shards = [], []
    for task in tasks:
        ts = time.perf_counter()
        shards.append(task.run())
        per_shard.append(round(time.perf_counter() - ts, 1))
    atomic_write_json(alt / ALT_SHARDS, [asdict(s) for s in shards])
    return {"factory": factory, "seconds": round(time.perf_counter() - t, 1), "seconds_per_shard": per_shard,
            "train_seconds": round(train_s, 1), "trained_from": str(shared.relative_to(work)) if shared.exists() else None,
            "index_bytes": sum(du(alt / s.faiss) for s in shards) + (du(alt / trained) if trained else 0),
            "embeddings_bytes": sum(du(alt / s.embeddings) for s in shards), "embeddings_linked": linked,
            "peak_rss_mb": round(peak_rss_mb(), 1)}


# -- stage: search ------------------------------------------------------------------------


def _single_queries(idx, q: np.ndarray, budget_s: float) -> tuple[list[float], list[np.ndarray]]:
    """One query a call, in order, for ``budget_s`` seconds (at least 20 queries, at most all):
    the milliseconds of each call and the ids it returned."""
    single, rows = [], []
    t_end = time.perf_counter() + budget_s
    for i in range(len(q)):
        t = time.perf_counter()
        _, r = idx.search(q[i : i + 1], K)
        single.append((time.perf_counter() - t) * 1000)
        rows.append(r[0])
        if time.perf_counter() > t_end and len(single) >= 20:
            break
    return single, rows


def stage_search(work: Path, factory: str, params: dict, budget_s: float) -> dict:
    from drgym.index.dense import DenseIndex
    from drgym.index.manifest import IndexManifest

    m = IndexManifest.read(work / "indexes" / "bench")
    alt = alt_folder(work, factory)
    q = np.load(work / "queries.npy")
    truth = np.load(work / "truth.npy")
    search_params = dict(params)
    workers = search_params.pop("shard_workers", None)  # drgym's, not a FAISS parameter
    t = time.perf_counter()
    idx = DenseIndex(alt, m.shards, m.dim, m.n_passages, device="cpu", search_params=search_params, mmap=True,
                     shard_workers=workers)
    load_s = time.perf_counter() - t
    after_load = rss_now()
    idx.search(q[:1], K)  # warm-up
    single, rows = _single_queries(idx, q, budget_s)
    recall = float(np.mean([len(set(r.tolist()) & set(truth[i].tolist())) / K for i, r in enumerate(rows)]))
    batch = []
    t_end = time.perf_counter() + budget_s
    for b in range(20):
        sel = np.arange(b * 64, b * 64 + 64) % N_QUERIES
        t = time.perf_counter()
        idx.search(q[sel], K)
        batch.append((time.perf_counter() - t) * 1000)
        if time.perf_counter() > t_end and len(batch) >= 3:
            break
    questions = {}
    if (work / "questions.npy").exists():  # question-like queries (gen stages of this version)
        qq, qtruth = np.load(work / "questions.npy"), np.load(work / "questions_truth.npy")
        qsingle, qrows = _single_queries(idx, qq, budget_s)
        if len(qrows) < N_QUERIES:  # recall over all of them; rankings do not depend on the batch
            qrows += list(idx.search(qq[len(qrows):], K)[1])
        questions = {"single_ms_p50": pct(qsingle, 50), "single_ms_p99": pct(qsingle, 99), "single_n": len(qsingle),
                     "recall@10": round(float(np.mean([len(set(r.tolist()) & set(qtruth[i].tolist())) / K
                                                       for i, r in enumerate(qrows)])), 4),
                     "recall_queries": len(qrows)}
    idx.close()
    return {"factory": factory, "params": params, "shards": len(m.shards), "shard_workers": idx.shard_workers,
            "questions": questions,
            "coarse_searches": idx.coarse_searches, "load_s": round(load_s, 2),
            "single_ms_p50": pct(single, 50), "single_ms_p99": pct(single, 99), "single_n": len(single),
            "batch64_ms_p50": pct(batch, 50), "batch64_ms_p99": pct(batch, 99), "batch64_n": len(batch),
            "recall@10": round(recall, 4), "recall_queries": len(rows),
            "rss_after_load_mb": after_load, "rss_end_mb": rss_now(), "peak_rss_mb": round(peak_rss_mb(), 1)}


# -- stage: bm25 --------------------------------------------------------------------------


def stage_bm25(work: Path) -> dict:
    """drgym's BM25 built streaming (:func:`drgym.index.bm25.write_bm25` with
    ``streaming=True``: memory bounded by a chunk of passages, the path a corpus too large
    for memory takes) over the docstore, into the bench index's own ``bm25`` folder."""
    import sqlite3

    from drgym.docstore import PASSAGE_TEXT
    from drgym.index.bm25 import BM25_DIR, write_bm25

    folder = work / "indexes" / "bench"
    db = folder / "docs.sqlite"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)

    def texts():
        cur = conn.execute(f"SELECT d.title, {PASSAGE_TEXT} FROM passages p JOIN documents d ON d.doc_id = p.doc_id "
                           "ORDER BY p.row")
        while rows := cur.fetchmany(10_000):
            yield from ((f"{a}\n{b}" if a else b) for a, b in rows)

    shutil.rmtree(folder / BM25_DIR, ignore_errors=True)
    base = rss_now()
    t = time.perf_counter()
    settings = write_bm25(folder, texts(), streaming=True)
    secs = time.perf_counter() - t
    peak = peak_rss_mb()
    pairs = settings.get("passage_term_pairs", 0)
    return {"engine": "bm25s files, built streaming", "seconds": round(secs, 1), "index_bytes": du(folder / BM25_DIR),
            "vocab": settings["vocab_size"], "pairs": pairs,
            "rss_before_mb": base.get("VmRSS"), "peak_rss_mb": round(peak, 1),
            "bytes_per_pair_measured": round((peak - base.get("VmRSS", 0)) * 2**20 / pairs, 1) if pairs else None}


def _latency(fn, budget_s: float) -> dict:
    """p50/p99 ms of ``fn(batch)`` over single queries and batches of 64 (min 20 / 3)."""
    fn([0])  # warm-up
    single, batch = [], []
    t_end = time.perf_counter() + budget_s
    for i in range(N_QUERIES):
        t = time.perf_counter()
        fn([i])
        single.append((time.perf_counter() - t) * 1000)
        if time.perf_counter() > t_end and len(single) >= 20:
            break
    t_end = time.perf_counter() + budget_s
    for b in range(20):
        sel = [int(x) for x in np.arange(b * 64, b * 64 + 64) % N_QUERIES]
        t = time.perf_counter()
        fn(sel)
        batch.append((time.perf_counter() - t) * 1000)
        if time.perf_counter() > t_end and len(batch) >= 3:
            break
    return {"single_ms_p50": pct(single, 50), "single_ms_p99": pct(single, 99), "single_n": len(single),
            "batch64_ms_p50": pct(batch, 50), "batch64_ms_p99": pct(batch, 99), "batch64_n": len(batch)}


def stage_text_search(work: Path, method: str, factory: str, params: dict, budget_s: float) -> dict:
    """BM25 or hybrid search latency at k=10 on the bench index, query encoding excluded
    (the vectors are synthetic; the encoder's cost is in scripts/bench_search.py).

    ``bm25``: :meth:`drgym.index.bm25.BM25Index.search` over the memory-mapped files.
    ``hybrid``: what :meth:`drgym.search.local.LocalSearchEngine.search_rows` does for
    ``method="hybrid"``: :data:`~drgym.search.local.RRF_DEPTH` candidates from the dense
    index ``factory`` (drgym's search parameters) and from BM25, fused by
    :func:`drgym.index.bm25.rrf_fuse`. Also reported: how many of the hybrid top 10 are
    in the exact dense top 10 (``dense_top10_in_hybrid``), a check that the fusion ran."""
    from drgym.index.bm25 import BM25Index, rrf_fuse
    from drgym.index.dense import DenseIndex
    from drgym.index.ranking import load_tie_rank
    from drgym.index.manifest import IndexManifest
    from drgym.search.local import RRF_DEPTH

    main_folder = work / "indexes" / "bench"
    m = IndexManifest.read(main_folder)
    texts = json.loads((work / "query_texts.json").read_text())
    q = np.load(work / "queries.npy")
    truth = np.load(work / "truth.npy")
    t = time.perf_counter()
    bm25 = BM25Index(main_folder, m.n_passages)
    tie = load_tie_rank(main_folder, m.n_passages)
    dense = None
    if method == "hybrid":
        dense = DenseIndex(alt_folder(work, factory), m.shards, m.dim, m.n_passages, device="cpu",
                           search_params=dict(params), mmap=True)
    load_s = time.perf_counter() - t
    after_load = rss_now()
    hits = []

    def bm25_only(sel):
        return bm25.search([texts[i] for i in sel], K, tie)

    def hybrid(sel):
        _, R = dense.search(q[sel], RRF_DEPTH)
        runs = bm25.search([texts[i] for i in sel], RRF_DEPTH, tie)
        return [rrf_fuse([R[j][R[j] >= 0], runs[j][1]], K, tie) for j in range(len(sel))]

    fn = hybrid if method == "hybrid" else bm25_only
    out = _latency(fn, budget_s)
    for i in range(N_QUERIES):
        rows = fn([i])[0][1]
        hits.append(len(rows))
        if method == "hybrid":
            out.setdefault("_in", []).append(len(set(rows.tolist()) & set(truth[i].tolist())))
    if method == "hybrid":
        out["dense_top10_in_hybrid"] = round(float(np.mean(out.pop("_in"))), 2)
    out.update({"method": method, "factory": factory if method == "hybrid" else None,
                "params": params if method == "hybrid" else None, "load_s": round(load_s, 2),
                "mean_hits": round(float(np.mean(hits)), 2), "query_words": QUERY_WORDS,
                "rss_after_load_mb": after_load, "rss_end_mb": rss_now(), "peak_rss_mb": round(peak_rss_mb(), 1)})
    return out


# -- driver -------------------------------------------------------------------------------


def run_stage(args: list[str], log) -> dict:
    """Run ``bench_scale.py _stage ...`` in a subprocess under the same interpreter."""
    cmd = [sys.executable, __file__, "_stage", *args]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    log.write(f"{now()} {' '.join(args)} rc={p.returncode} {time.perf_counter() - t:.0f}s\n{p.stderr[-3000:]}\n")
    log.flush()
    if p.returncode < 0:  # killed: its last stderr line is whatever it printed before, not the cause
        sig = signal.Signals(-p.returncode).name
        why = " (SIGKILL: the kernel's OOM killer, see dmesg, or a user)" if sig == "SIGKILL" else ""
        return {"error": f"killed by {sig}{why} after {time.perf_counter() - t:.0f} s",
                "load_avg": os.getloadavg()}
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"rc {p.returncode}",
                "load_avg": os.getloadavg()}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    out["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")  # None: faiss's default, one per core
    return out


def ivfpq(n: int, shard_size: int) -> str:
    """The IVF-PQ factory ``auto`` would pick for a shard of this size (also below the
    size where ``auto`` still picks Flat)."""
    from drgym.index.build import ivfpq_factory

    return ivfpq_factory(min(n, shard_size), DIM)


def fit(xs: list[float], ys: list[float]) -> dict | None:
    """Least-squares ``y = a * x**b`` in log-log space."""
    pts = [(x, y) for x, y in zip(xs, ys) if x and y and y > 0]
    if len(pts) < 2:
        return None
    lx, ly = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    b, la = np.polyfit(lx, ly, 1)
    return {"b": round(float(b), 3), "a": float(f"{math.exp(la):.4g}"), "points": len(pts)}


def fits(res: dict) -> dict:
    out = {}
    sizes = sorted(res["sizes"], key=int)
    ns = [int(s) for s in sizes]
    imp = [res["sizes"][s].get("import", {}) for s in sizes]
    out["import_seconds"] = fit(ns, [i.get("seconds") for i in imp])
    out["docstore_bytes"] = fit(ns, [i.get("docstore_bytes") for i in imp])
    out["import_peak_rss_mb"] = fit(ns, [i.get("peak_rss_mb") for i in imp])
    for fam in ("Flat", "HNSW32", "IVF-PQ"):
        d = [res["sizes"][s].get("dense", {}).get(fam, {}) for s in sizes]
        out[f"{fam}_build_seconds"] = fit(ns, [x.get("seconds") for x in d])
        out[f"{fam}_index_bytes"] = fit(ns, [x.get("index_bytes") for x in d])
        out[f"{fam}_build_peak_rss_mb"] = fit(ns, [x.get("peak_rss_mb") for x in d])
        srch = [res["sizes"][s].get("search", {}).get(fam, {}) for s in sizes]
        out[f"{fam}_single_ms_p50"] = fit(ns, [x.get("single_ms_p50") for x in srch])
        out[f"{fam}_batch64_ms_p50"] = fit(ns, [x.get("batch64_ms_p50") for x in srch])
    return {k: v for k, v in out.items() if v}


def side_by_side_record(**fields) -> dict:
    """The head of a side-by-side benchmark's JSON (``bench_shared_quantizer.py``,
    ``bench_calibrate.py``, ``bench_madvise.py``): the command, start time, machine and
    commit, then ``fields``."""
    return {"command": " ".join(["python", *sys.argv]), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
            "code_commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                          text=True).stdout.strip(), **fields}


def side_by_side_parser(doc: str, timing: bool = True) -> argparse.ArgumentParser:
    """The arguments of a side-by-side benchmark (``bench_shared_quantizer.py``,
    ``bench_calibrate.py``, ``bench_madvise.py``, ``bench_probe_groups.py``): ``--work``
    and ``--out``, and with ``timing`` ``--passes`` and ``--repeat``
    (:func:`time_in_turns`); the description is ``doc``'s first line."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="a bench_scale.py work folder of one size (WORK/n<N>)")
    ap.add_argument("--out", type=Path, required=True)
    if timing:
        ap.add_argument("--passes", type=int, default=3, help="passes over the queries (the order of layouts alternates)")
        ap.add_argument("--repeat", type=int, default=1, help="runs of the whole comparison, each loading the indexes anew")
    return ap


def turn_stats(t: np.ndarray, found: list, truth: np.ndarray) -> dict:
    """One setting's figures from :func:`time_in_turns`: p50 and p99 ms of one query and the
    searches timed (``t``), and recall@10 of ``found`` (each query's top-10 rows) against
    ``truth`` (``(nq, 10)`` exact rows)."""
    recall = float(np.mean([len(set(r.tolist()) & set(truth[i].tolist())) / 10 for i, r in enumerate(found)]))
    return {"single_ms_p50": round(float(np.median(t)), 3), "single_ms_p99": round(float(np.percentile(t, 99)), 3),
            "n": len(t), "recall@10": round(recall, 4)}


def median_ratio(t: np.ndarray, base: np.ndarray) -> float:
    """The median over queries of ``t / base``, times of the same searches in turns."""
    return round(float(np.median(t / base)), 3)


def add_run(res: dict, run: dict) -> None:
    """Append one run to a side-by-side record and print it (a line of JSON), as it ends."""
    res["runs"].append(run)
    print(json.dumps(run), flush=True)


def finish_record(res: dict, out: Path) -> None:
    """Stamp ``finished`` and write a side-by-side benchmark's JSON to ``out`` atomically."""
    from drgym.atomic import atomic_write_json

    res["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    atomic_write_json(out, res, indent=1)


def time_in_turns(indexes: dict, q: np.ndarray, passes: int,
                  cpu_ms: dict | None = None) -> tuple[dict, dict, list[float]]:
    """Time one query at a time (k=10) through each :class:`drgym.index.dense.DenseIndex`
    of ``indexes`` (``{name: index}``), the layouts in turns query by query and their
    order alternating between passes, so that all see the same machine state; one
    warm-up pass of each first pages in its codes. ``cpu_ms``, when given, receives the
    process CPU ms of each search (every thread's), ``{name: (passes * nq,)}``.

    Returns:
        ``(ms, rows, loads)``: float ms per search ``{name: (passes * nq,)}``, each query's
        top-10 rows of the last pass ``{name: [(10,) int64]}``, and the 1-minute load
        average before and after each pass.
    """
    names = list(indexes)
    for name in names:
        for i in range(len(q)):
            indexes[name].search(q[i:i + 1], 10)
    times = {name: [] for name in names}
    cpu = {name: [] for name in names}
    rows = {name: [None] * len(q) for name in names}
    loads = [os.getloadavg()[0]]
    for p in range(passes):
        for i in range(len(q)):
            for name in (names if (i + p) % 2 == 0 else names[::-1]):
                c, t = time.process_time(), time.perf_counter()
                _, r = indexes[name].search(q[i:i + 1], 10)
                times[name].append((time.perf_counter() - t) * 1000)
                cpu[name].append((time.process_time() - c) * 1000)
                rows[name][i] = r[0]
        loads.append(os.getloadavg()[0])
    if cpu_ms is not None:
        cpu_ms.update({name: np.asarray(c) for name, c in cpu.items()})
    return {name: np.asarray(t) for name, t in times.items()}, rows, loads


def write(res: dict, out: Path) -> None:
    from drgym.atomic import atomic_write_json

    res["fits"] = fits(res)
    atomic_write_json(out, res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 5_000_000])
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "bench_scale")
    ap.add_argument("--out", type=Path, default=REPO / "scripts" / "results" / "bench_scale.json")
    ap.add_argument("--shard-size", type=int, default=2_500_000)
    ap.add_argument("--hnsw-max", type=int, default=1_000_000, help="largest N for HNSW32 (build time)")
    ap.add_argument("--bm25-max", type=int, default=1_000_000, help="largest N for the BM25 stage")
    ap.add_argument("--flat-max", type=int, default=5_000_000,
                    help="largest N with a Flat FAISS index (above it the import builds IVF-PQ and Flat is not measured: "
                         "at 2.1x10^7 384-d passages its file alone is 32 GB)")
    ap.add_argument("--gzip-above", type=int, default=5_000_000,
                    help="largest N whose generated corpus is plain JSONL; above it gen writes it gzip-compressed "
                         "(level 1), so that the corpus, vectors, docstore and embeddings fit on the disk together "
                         "during the import (at 2.1x10^7: 16 GB of JSONL)")
    ap.add_argument("--budget", type=float, default=90.0, help="seconds per latency measurement (min 20 singles, 3 batches)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder of each size")
    ap.add_argument("--curve", action="store_true",
                    help="IVF-PQ only: recall@10 and latency over a grid of nprobe x exact re-rank depth "
                         "(CURVE_NPROBE x CURVE_RERANK), the curve the search defaults are chosen from")
    ap.add_argument("--curve-nprobe", type=int, nargs="+", default=list(CURVE_NPROBE),
                    help="the curve's nprobe values (default: CURVE_NPROBE)")
    ap.add_argument("--curve-rerank", type=int, nargs="+", default=list(CURVE_RERANK),
                    help="the curve's re-rank depths, candidates re-scored per query in all shards (default: CURVE_RERANK)")
    ap.add_argument("--ivf-factory", default=None,
                    help="the IVF-PQ factory of the dense, search and curve stages (default: what `auto` picks for a "
                         "shard, e.g. IVF2048,PQ48x4fs); the import stage "
                         "still builds `auto`'s. A suffix +own trains each shard on its own rows instead of one "
                         "quantizer for all (the layout before shared quantizers), e.g. IVF2048,PQ48x4fs+own")
    ap.add_argument("--validate-questions", type=Path, metavar="OUT",
                    help="write validate_questions()'s JSON (question-like queries vs real questions at wiki-default's size) and exit")
    ap.add_argument("--table", type=Path, help="print the README table of a result JSON and exit")
    ap.add_argument("--paper", type=Path, help="print the README's extrapolation to wiki-18 and ClueWeb22-B and exit")
    ap.add_argument("--sizing", type=Path, help="print the sizing table (per 10^6 passages, and wiki-18) of a result JSON and exit")
    a = ap.parse_args()
    if a.validate_questions:
        a.validate_questions.write_text(json.dumps(validate_questions(), indent=1) + "\n", encoding="utf-8")
        return
    if a.table:
        print(table(json.loads(a.table.read_text())))
        return
    if a.paper:
        print(paper(json.loads(a.paper.read_text())))
        return
    if a.sizing:
        print(sizing(json.loads(a.sizing.read_text())))
        return
    res = json.loads(a.out.read_text()) if a.out.exists() else {}
    import faiss

    res.setdefault("sizes", {})
    res.update({
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "platform": platform.platform(),
                    "ram_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                    "python": platform.python_version(), "faiss": faiss.__version__, "numpy": np.__version__},
        "settings": {"dim": DIM, "queries": N_QUERIES, "k": K, "shard_size": a.shard_size, "hnsw_max": a.hnsw_max,
                     "words_per_passage": WORDS, "vocab": VOCAB, "seed": SEED,
                     "vectors": "topic mixture fitted to drgym's 21,123 shipped MiniLM vectors (see docstring)",
                     "search_defaults": "drgym's DEFAULT_SEARCH_PARAMS: efSearch 64, nprobe 0 = auto_nprobe(nlist) (the layouts are not calibrated), rerank 100",
                     "flat_search": "FAISS files memory-mapped (IO_FLAG_MMAP_IFC): RSS counts the page cache"},
        "started": res.get("started") or now(),
        "code_commit": os.environ.get("DRGYM_BENCH_COMMIT") or subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
    })
    a.out.parent.mkdir(parents=True, exist_ok=True)
    log = open(a.out.with_suffix(".log"), "a")
    for n in a.sizes:
        key = str(n)
        r = res["sizes"].setdefault(key, {})
        work = a.work / f"n{n}"
        if work.exists() and "import" not in r:
            shutil.rmtree(work)
        if not work.exists() and r and not r.get("complete"):
            # an unfinished size whose files are gone (another machine): every stage again
            r.clear()
        if "gen" not in r or "error" in r["gen"]:
            r["gen"] = run_stage(["gen", key, str(work)] + (["gz"] if n > a.gzip_above else []), log)
            write(res, a.out)
        if "import" not in r or "error" in r["import"]:
            imp_factory = "Flat" if n <= a.flat_max else ivfpq(n, a.shard_size)
            r["import"] = run_stage(["import", key, str(work), str(a.shard_size), imp_factory], log)
            write(res, a.out)
        if "error" in r["gen"] or "error" in r["import"]:
            # every later stage needs the index: stop this size, and keep its work folder so
            # that a rerun goes on from the stage that failed
            print(f"N={n}: {'gen' if 'error' in r['gen'] else 'import'} failed; the work folder {work} is kept",
                  file=sys.stderr)
            continue
        from drgym.index.build import FLAT_MAX
        from drgym.index.search_params import DEFAULT_SEARCH_PARAMS

        ivf = a.ivf_factory or ivfpq(n, a.shard_size)
        families = {"Flat": "Flat", "IVF-PQ": ivf}
        if n > a.flat_max:  # exact top-10 comes from the gen stage; no Flat file on the disk
            del families["Flat"]
        if n <= a.hnsw_max:
            families["HNSW32"] = "HNSW32"
        if a.curve:
            families = {"IVF-PQ": ivf}
        r.setdefault("dense", {})
        r.setdefault("search", {})
        bm25_ok = False
        if n <= a.bm25_max and not a.curve:
            if "bm25" not in r or "error" in r["bm25"]:
                r["bm25"] = run_stage(["bm25", str(work)], log)
                write(res, a.out)
            bm25_ok = "error" not in r["bm25"]
            if bm25_ok and ("BM25" not in r["search"] or "error" in r["search"]["BM25"]):
                r["search"]["BM25"] = run_stage(["text_search", str(work), "bm25", "-", "{}", str(a.budget)], log)
                write(res, a.out)
        for fam, factory in families.items():
            if fam not in r["dense"] or "error" in r["dense"][fam]:
                r["dense"][fam] = run_stage(["dense", str(work), factory], log)
                write(res, a.out)
            settings = [(fam, {})]  # drgym defaults
            if fam == "IVF-PQ" and a.curve:
                settings = [(f"IVF-PQ nprobe {p} rerank {r}", {"nprobe": p, "rerank": r})
                            for p in a.curve_nprobe for r in a.curve_rerank]
            elif fam == "IVF-PQ":
                settings += [("IVF-PQ nprobe 16", {"nprobe": 16}), ("IVF-PQ rerank 0", {"rerank": 0})]
                if n > a.shard_size:  # several shards: also searched one after another (shard_workers=1), beside the default side by side
                    settings += [("IVF-PQ shards in turn", {"shard_workers": 1})]
            for label, params in settings:
                if label not in r["search"] or "error" in r["search"][label]:
                    full = {**DEFAULT_SEARCH_PARAMS, **params}
                    r["search"][label] = run_stage(["search", str(work), factory, json.dumps(full), str(a.budget)], log)
                    write(res, a.out)
            label = f"hybrid ({fam} + BM25)"
            # hybrid with the dense index `auto` picks at this size (Flat up to FLAT_MAX, IVF-PQ beyond), and
            # with IVF-PQ at every size
            auto_fam = "Flat" if n <= FLAT_MAX else "IVF-PQ"
            if bm25_ok and fam in (auto_fam, "IVF-PQ") and (label not in r["search"] or "error" in r["search"][label]):
                r["search"][label] = run_stage(["text_search", str(work), "hybrid", factory,
                                                json.dumps(DEFAULT_SEARCH_PARAMS), str(a.budget)], log)
                write(res, a.out)
            if not a.keep:
                shutil.rmtree(alt_folder(work, factory), ignore_errors=True)
        r["complete"] = True
        write(res, a.out)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    res["finished"] = now()
    write(res, a.out)
    print(table(res))


def _stage(argv: list[str]) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    private = PrivatePeak()
    kind = argv[0]
    if kind == "gen":
        out = stage_gen(int(argv[1]), Path(argv[2]), gz=argv[3:4] == ["gz"])
    elif kind == "import":
        out = stage_import(int(argv[1]), Path(argv[2]), int(argv[3]), *argv[4:5])
    elif kind == "dense":
        out = stage_dense(Path(argv[1]), argv[2])
    elif kind == "search":
        out = stage_search(Path(argv[1]), argv[2], json.loads(argv[3]), float(argv[4]))
    elif kind == "bm25":
        out = stage_bm25(Path(argv[1]))
    elif kind == "text_search":
        out = stage_text_search(Path(argv[1]), argv[2], argv[3], json.loads(argv[4]), float(argv[5]))
    else:
        raise SystemExit(f"unknown stage {kind}")
    out["peak_private_mb"] = round(max(private.peak, rss_now().get("RssAnon", 0.0)), 1)
    print(json.dumps(out))


def table(res: dict) -> str:
    """Markdown tables of a result JSON (the README's Scale tables): the import (docstore,
    embeddings) per size, then each FAISS index and search setting."""
    gb = lambda b: f"{b / 2**30:.2f}" if b else "-"  # noqa: E731
    ms = lambda s, k: f"{s[k + '_p50']:.1f} / {s[k + '_p99']:.1f}"  # noqa: E731
    sizes = sorted(res["sizes"], key=int)
    out = ["| N | import (s) | import peak RSS / private GB | docstore GB | float16 embeddings GB | BM25 build (s) "
           "| BM25 peak RSS / private GB | BM25 index GB |",
           "|---|---|---|---|---|---|---|---|"]
    peaks = lambda st: f"{gb(st.get('peak_rss_mb', 0) * 2**20)} / {gb(st.get('peak_private_mb', 0) * 2**20)}"  # noqa: E731
    for key in sizes:
        imp, bm = res["sizes"][key].get("import", {}), res["sizes"][key].get("bm25", {})
        out.append(f"| {int(key):,} | {imp.get('seconds', '-')} | {peaks(imp)} "
                   f"| {gb(imp.get('docstore_bytes'))} | {gb(imp.get('embeddings_bytes'))} | {bm.get('seconds', '-')} "
                   f"| {peaks(bm)} | {gb(bm.get('index_bytes'))} |")
    out += ["", "| N | index (search setting) | FAISS build (s) | build peak RSS GB | index GB | 1 query p50 / p99 (ms) "
                "| 64 queries p50 / p99 (ms) | recall@10 | search peak RSS GB |",
            "|---|---|---|---|---|---|---|---|---|"]
    for key in sizes:
        r = res["sizes"][key]
        for label, s in r.get("search", {}).items():
            if "error" in s:
                out.append(f"| {int(key):,} | {label} | error: {s['error'][:80]} | | | | | | |")
                continue
            if s.get("method") in ("bm25", "hybrid"):  # text search: BM25 built streaming, or RRF of dense + BM25
                bm = r.get("bm25", {})
                if s["method"] == "bm25":
                    name, build = "BM25 (bm25s files, streamed build, memory-mapped)", bm
                else:
                    fam = label[len("hybrid ("):].split(" + ")[0]
                    name = f"hybrid: {r.get('dense', {}).get(fam, {}).get('factory', fam)} + BM25, RRF of 100 each"
                    build = {}
                out.append(f"| {int(key):,} | {name} | {build.get('seconds', '-')} "
                           f"| {gb(build.get('peak_rss_mb', 0) * 2**20)} | {gb(build.get('index_bytes'))} "
                           f"| {ms(s, 'single_ms')} | {ms(s, 'batch64_ms')} | - | {gb(s['peak_rss_mb'] * 2**20)} |")
                continue
            fam = "IVF-PQ" if label.startswith("IVF-PQ") else label
            d = r.get("dense", {}).get(fam, {})
            name = d.get("factory", fam) + ("" if label == fam else " (" + label.split(" ", 1)[1] + ")")
            out.append(f"| {int(key):,} | {name} | {d.get('seconds', '-')} | {gb(d.get('peak_rss_mb', 0) * 2**20)} "
                       f"| {gb(d.get('index_bytes'))} | {ms(s, 'single_ms')} | {ms(s, 'batch64_ms')} "
                       f"| {s['recall@10']:.3f} | {gb(s['peak_rss_mb'] * 2**20)} |")
    return "\n".join(out)


# -- sizing: RAM, disk and build time per 10^6 passages ---------------------------------------

WIKI18 = 21_015_324


def _per_m(x: float | None, n: int) -> float | None:
    return None if x is None else x * 1e6 / n


def sizing(res: dict) -> str:
    """The sizing table: disk, memory and build time per 10^6 passages at each measured
    size (so that linear growth can be read off), and wiki-18 (21,015,324 passages) at
    384-d from the largest size and at 768-d with the vector terms doubled.

    Rules (stated with the table): bytes on disk per passage are measured (docstore,
    float16 embeddings, tie ranks, FAISS file, BM25 files); vector terms scale with the
    dimension (Flat 4*d, float16 rows 2*d, PQ codes m/2 with m = d/8), text terms do not.
    Build times are wall-clock per 10^6 passages on the benchmark machine, one FAISS
    thread, and scale linearly except IVF training (sample size fixed per list).
    "Serving memory" is the search process's private memory (RssAnon) at the end of the
    search stage; what else it reads comes from the page cache (memory-mapped files).
    """
    sizes = sorted((k for k, r in res["sizes"].items() if "import" in r and "error" not in r["import"]), key=int)
    gb = lambda b: "-" if b is None else f"{b / 1e9:.2f}"  # noqa: E731
    rows: list[tuple[str, list]] = []

    def add(name: str, fn) -> None:
        vals = []
        for k in sizes:
            try:
                vals.append(fn(res["sizes"][k], int(k)))
            except (KeyError, TypeError, ZeroDivisionError):
                vals.append(None)
        rows.append((name, vals))

    ivf = lambda r: r.get("dense", {}).get("IVF-PQ", {})  # noqa: E731
    flat = lambda r: r.get("dense", {}).get("Flat", {})  # noqa: E731
    add("docstore (SQLite), disk GB", lambda r, n: _per_m(r["import"]["docstore_bytes"], n))
    add("float16 embeddings, disk GB", lambda r, n: _per_m(r["import"]["embeddings_bytes"], n))
    add("tie ranks, disk GB", lambda r, n: _per_m(r["import"]["tie_rank_bytes"], n))
    add("Flat FAISS file, disk GB", lambda r, n: _per_m(flat(r)["index_bytes"], n))
    add("IVF-PQ (auto) FAISS file, disk GB", lambda r, n: _per_m(ivf(r)["index_bytes"], n))
    add("BM25 files, disk GB", lambda r, n: _per_m(r["bm25"]["index_bytes"], n))
    add("import, s", lambda r, n: _per_m(r["import"]["seconds"] * 1e9, n))
    add("BM25 streamed build, s", lambda r, n: _per_m(r["bm25"]["seconds"] * 1e9, n))
    add("IVF-PQ build, s", lambda r, n: _per_m(ivf(r)["seconds"] * 1e9, n))
    time_rows = {"import, s", "BM25 streamed build, s", "IVF-PQ build, s"}
    peaks = [("import peak private memory GB", lambda r: r["import"]["peak_private_mb"]),
             ("BM25 build peak private memory GB", lambda r: r["bm25"]["peak_private_mb"]),
             ("IVF-PQ build peak private memory GB", lambda r: ivf(r)["peak_private_mb"]),
             ("IVF-PQ serving, private GB", lambda r: r["search"]["IVF-PQ"]["rss_end_mb"]["RssAnon"]),
             ("hybrid serving, private GB", lambda r: r["search"]["hybrid (IVF-PQ + BM25)"]["rss_end_mb"]["RssAnon"])]
    head = [f"{int(k):,}" for k in sizes]
    out = ["| per 10^6 passages | " + " | ".join(f"at N = {h}" for h in head) + " |",
           "|---" * (len(head) + 1) + "|"]
    for name, vals in rows:
        fmt = (lambda v: "-" if v is None else f"{v / 1e9:,.0f}") if name in time_rows else gb
        out.append(f"| {name} | " + " | ".join(fmt(v) for v in vals) + " |")
    out += ["", "| whole index, not per 10^6 | " + " | ".join(f"at N = {h}" for h in head) + " |",
            "|---" * (len(head) + 1) + "|"]
    for name, fn in peaks:
        vals = []
        for k in sizes:
            try:
                vals.append(f"{fn(res['sizes'][k]) / 1024:.2f}")
            except (KeyError, TypeError):
                vals.append("-")
        out.append(f"| {name} | " + " | ".join(vals) + " |")
    # wiki-18 from the largest size with every row measured
    flat_row = "Flat FAISS file, disk GB"  # 4 * dim bytes a row: computed where no Flat index was measured
    big = next((k for k in reversed(sizes)
                if all(v[sizes.index(k)] is not None for name, v in rows if name != flat_row)), None)
    if big is None:
        return "\n".join(out)
    i = sizes.index(big)
    per = {name: vals[i] for name, vals in rows}
    d0 = res["settings"]["dim"]
    if per[flat_row] is None:
        per[flat_row] = 4.0 * d0 * 1e6
    vec = {"float16 embeddings, disk GB", "Flat FAISS file, disk GB", "IVF-PQ (auto) FAISS file, disk GB"}
    out += ["", f"| wiki-18, {WIKI18:,} passages (from N = {int(big):,}) | {d0}-d | {2 * d0}-d |", "|---|---|---|"]
    tot = {d0: 0.0, 2 * d0: 0.0}
    for name in ("docstore (SQLite), disk GB", "float16 embeddings, disk GB", "tie ranks, disk GB",
                 "IVF-PQ (auto) FAISS file, disk GB", "BM25 files, disk GB", "Flat FAISS file, disk GB"):
        a = per[name] * WIKI18 / 1e6
        b = a * (2 if name in vec else 1)
        if name != "Flat FAISS file, disk GB":
            tot[d0] += a
            tot[2 * d0] += b
        out.append(f"| {name.replace(', disk GB', '')}, disk GB | {a / 1e9:,.1f} | {b / 1e9:,.1f} |")
    out.append(f"| disk for hybrid with IVF-PQ (all but Flat), GB | {tot[d0] / 1e9:,.1f} | {tot[2 * d0] / 1e9:,.1f} |")
    for name in sorted(time_rows):
        a = per[name] * WIKI18 / 1e6 / 1e9 / 3600
        # at 2 x dim: BM25 has no vector term; IVF-PQ training and assignment grow with dim; the
        # import's text part does not, its embedding copy does: at least the 384-d time
        b = {"BM25 streamed build, s": f"{a:,.1f}", "IVF-PQ build, s": f"{2 * a:,.1f}"}.get(name, f">= {a:,.1f}")
        out.append(f"| {name.replace(', s', '')}, hours (linear in N) | {a:,.1f} | {b} |")
    return "\n".join(out)


# -- on paper: wiki-18 and ClueWeb22-B ------------------------------------------------------

ASSUMED = {
    # Not measured here (no GPU on the benchmark machine): encoding throughput per GPU.
    "e5-base-v2 passages/s per A100 (fp16, 100-word passages)": 2000,
    "MiniCPM-Embedding-Light documents/s per A100 (fp16, 512 tokens)": 300,
    # ClueWeb22-B clean text per document (the docstore keeps it whole); set your own.
    "ClueWeb22-B text bytes per document": 5000,
}
TARGETS = [
    # name, vectors, dim, shards, factory family, vectors' text bytes (None: as the bench's 100-word passages),
    # encoder throughput key
    ("wiki-18, one machine (`auto`: IVF-PQ)", 21_015_324, 768, 1, "IVF-PQ", None,
     "e5-base-v2 passages/s per A100 (fp16, 100-word passages)"),
    ("wiki-18, Search-R1's `e5_Flat.index` imported", 21_015_324, 768, 1, "Flat", None,
     "e5-base-v2 passages/s per A100 (fp16, 100-word passages)"),
    ("wiki-18, 4 Ray shards (IVF-PQ)", 21_015_324, 768, 4, "IVF-PQ", None,
     "e5-base-v2 passages/s per A100 (fp16, 100-word passages)"),
    ("ClueWeb22-B, 4 Ray shards (IVF-PQ), one vector a document", 87_000_000, 1024, 4, "IVF-PQ",
     "ClueWeb22-B text bytes per document", "MiniCPM-Embedding-Light documents/s per A100 (fp16, 512 tokens)"),
]


def _ivfpq_shape(factory: str) -> tuple[int, float]:
    """``(nlist, code bytes per vector)`` of ``IVF{nlist},PQ{m}`` (m bytes) or
    ``IVF{nlist},PQ{m}x4fs`` (4-bit codes: m/2 bytes)."""
    import re as _re

    nlist, m, fs = _re.fullmatch(r"IVF(\d+),PQ(\d+)(x4fs)?", factory).groups()
    return int(nlist), int(m) / 2 if fs else float(m)


def paper(res: dict) -> str:
    """The README's extrapolation: per-shard figures of the largest measured size scaled to
    wiki-18 (21,015,324 passages, e5-base-v2, 768-d) and ClueWeb22-B (87M documents,
    MiniCPM-Embedding-Light, 1024-d, one vector a document as DeepResearchGym embeds them).

    Scaling rules (stated in the README): index memory from the factory's bytes per vector;
    Flat search time ∝ rows x dim; IVF-PQ search time ∝ rows x code bytes (drgym's
    ``nprobe = nlist/4`` scans a quarter of a shard's codes); IVF-PQ build time ∝
    rows x nlist x dim (coarse assignment); docstore bytes = measured bytes per passage
    beyond the passage text + the text; encoding from :data:`ASSUMED` GPU throughputs.
    """
    from drgym.index.build import ivfpq_factory

    key = max((k for k, r in res["sizes"].items() if "Flat" in r.get("search", {}) and "IVF-PQ" in r.get("search", {})
               and "error" not in r["search"]["IVF-PQ"]), key=int)
    r = res["sizes"][key]
    n0, shards0 = int(key), int(r["import"]["shards"])
    rows0, d0 = n0 / shards0, res["settings"]["dim"]
    flat_ms0 = r["search"]["Flat"]["single_ms_p50"] / shards0  # shards are searched one after the other
    ivf_ms0 = r["search"]["IVF-PQ"]["single_ms_p50"] / shards0
    ivf_fac0 = r["dense"]["IVF-PQ"]["factory"]
    nlist0, m0 = _ivfpq_shape(ivf_fac0)
    ivf_build0 = float(np.mean(r["dense"]["IVF-PQ"]["seconds_per_shard"]))
    text0 = r["gen"]["corpus_bytes"] / n0 - 30  # JSONL minus the {"id", "contents"} wrapping
    doc_over = r["import"]["docstore_bytes"] / n0 - text0
    gb = lambda b: f"{b / 1e9:,.1f} GB"  # noqa: E731
    rows = {k: [] for k in ("vectors, dim", "shards x vectors", "FAISS index", "RAM per shard (index)",
                            "float16 embeddings per shard (disk, page cache)", "docstore (disk)",
                            "tie ranks (router, memory-mapped)", "encoding (assumed GPU throughput)",
                            "FAISS build per shard (2 CPU cores, scaled)", "search per shard, 1 query (1 core, scaled)")}
    heads = []
    for name, n, d, shards, fam, text_key, enc_key in TARGETS:
        heads.append(name)
        rows_s = n / shards
        rows["vectors, dim"].append(f"{n:,}, {d}")
        rows["shards x vectors"].append(f"{shards} x {rows_s / 1e6:,.2f}M")
        if fam == "Flat":  # memory-mapped (DenseIndex mmap=True): page cache rather than private RAM
            fac, ram = "Flat", 4 * d * rows_s
            ms = flat_ms0 * rows_s / rows0 * d / d0
            build = "append only (minutes)"
        else:
            fac = ivfpq_factory(int(rows_s), d)
            nlist, m = _ivfpq_shape(fac)
            ram = (m + 8) * rows_s + 4 * d * nlist + 4 * 256 * d
            ms = ivf_ms0 * rows_s / rows0 * m / m0
            hours = ivf_build0 * (rows_s * nlist * d) / (rows0 * nlist0 * d0) / 3600
            build = f"{hours:,.0f} h (a GPU cuts the k-means and assignment)"
        text = ASSUMED[text_key] if text_key else text0
        rows["FAISS index"].append(fac)
        rows["RAM per shard (index)"].append(gb(ram))
        rows["float16 embeddings per shard (disk, page cache)"].append(
            gb(2 * d * rows_s) if fam != "Flat" else f"none (the {gb(4 * d * rows_s)} FAISS file holds the vectors)")
        rows["docstore (disk)"].append(gb(n * (doc_over + text)))
        rows["tie ranks (router, memory-mapped)"].append(gb(8 * n))
        rate = ASSUMED[enc_key]
        rows["encoding (assumed GPU throughput)"].append(
            f"{n / rate / 3600:,.1f} GPU-hours: {n / rate / 3600 / 8:,.1f} h on 8 GPUs")
        rows["FAISS build per shard (2 CPU cores, scaled)"].append(build)
        rows["search per shard, 1 query (1 core, scaled)"].append(f"{ms:,.0f} ms")
    out = [f"Measured basis: {n0:,} vectors in {shards0} shard(s) of {rows0 / 1e6:g}M, {d0}-d, "
           f"Flat {flat_ms0:.1f} ms and {ivf_fac0} {ivf_ms0:.2f} ms per shard and query, {ivf_fac0} build "
           f"{ivf_build0:,.0f} s per shard, docstore {doc_over:,.0f} bytes per passage beyond its text "
           f"(load average {r['search']['Flat'].get('load_avg', ['?'])[0]} during the search runs).", "",
           "| | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for k, v in rows.items():
        out.append(f"| {k} | " + " | ".join(v) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_stage":
        _stage(sys.argv[2:])
    else:
        main()
