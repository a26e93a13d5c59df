"""Retrieval evaluation with relevance judgements (qrels) and TREC run files.

The files are the TREC ones every IR toolkit reads:

- **qrels**: one judgement a line, ``qid 0 docid rel`` (whitespace-separated; ``rel``
  an integer, > 0 relevant);
- **run**: one ranked hit a line, ``qid Q0 docid rank score tag`` (rank from 1, higher
  score better);
- **queries**: TSV ``qid<TAB>query`` or JSONL ``{"qid": ..., "query": ...}``.

Scores come from ``ir-measures`` (pytrec_eval's ``trec_eval`` measures, and its
MS MARCO provider for the reciprocal rank at a cutoff): recall@5/10/100
(``R@k``: relevant documents in the top k over all relevant documents), nDCG@10 (graded
gains ``rel``, log2 discount, ``trec_eval``'s ``ndcg_cut``) and MRR@10 (``RR@10``: 1 over
the rank of the first relevant document in the top 10, else 0).

Overall figures are means over the **judged queries**: queries of the qrels with at
least one relevant document. A judged query the run does not answer scores 0 on every
measure (``trec_eval`` would leave it out of the mean and report a better figure); run
queries without judgements are not scored and are counted in ``unjudged_queries``.

drgym's index splits long documents into passages; runs here are at **document level**:
the engine's ``collapse="document"`` ranking (k distinct documents, each scored by its
best passage), each hit named by its parent document's ``doc_id``, which is what qrels
name.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Iterable

import ir_measures

from drgym.atomic import atomic_write_json, atomic_write_text
from drgym.corpus.qrels import Qrels, check_trec_id, nonblank_lines, read_qrels, write_qrels
from drgym.errors import ConfigError, CorpusError, DocumentNotFoundError

__all__ = ["MEASURES", "METRIC_NAMES", "RUN_DEPTH", "Qrels", "Run", "check_qrels_ids", "evaluate_engine", "read_qrels", "read_queries",
           "read_run", "run_engine", "score_run", "write_qrels", "write_run"]

MEASURES = ("R@5", "R@10", "R@100", "nDCG@10", "RR@10")
"""The measures :func:`score_run` reports, in ``ir-measures`` notation."""
METRIC_NAMES = {"R@5": "recall@5", "R@10": "recall@10", "R@100": "recall@100", "nDCG@10": "ndcg@10",
                "RR@10": "mrr@10"}
"""``ir-measures`` name -> the key used in drgym's JSON."""
RUN_DEPTH = 100
"""Hits per query written to a run: enough for recall@100."""

Run = dict[str, list[tuple[str, float]]]
"""``{qid: [(docid, score), ...]}``, best first."""

log = logging.getLogger(__name__)


def check_qrels_ids(engine: Any, qrels: Qrels, queries: dict[str, str] | None = None) -> dict[str, Any]:
    """Check that the relevant documents of ``qrels`` are documents of ``engine``'s index.

    Qrels name documents by doc_id; a run names the index's doc_ids. When the two are
    spelled differently (``"0"`` against ``"wiki18-0"``), every measure would be 0.0
    without a word, so none found is an error; some missing is a warning (each missing
    relevant document lowers recall as a miss would).

    Args:
        engine: anything with ``get(doc_id)`` raising
            :class:`~drgym.errors.DocumentNotFoundError` for an unknown id (a
            :class:`~drgym.search.local.LocalSearchEngine`).
        qrels: ``{qid: {docid: rel}}``.
        queries: ``{qid: query}``; the first is searched to show an id of the index in the
            error.

    Returns:
        ``{"relevant_docs": n, "relevant_docs_not_in_index": m, "missing_examples": [...]}``
        (up to 5 examples).

    Raises:
        ConfigError: no relevant document of the qrels is a doc_id of the index.
    """

    ids = sorted({d for docs in qrels.values() for d, r in docs.items() if r > 0})
    missing = []
    for d in ids:
        try:
            engine.get(d)
        except DocumentNotFoundError:
            missing.append(d)
    name = getattr(getattr(engine, "manifest", None), "name", None) or getattr(engine, "name", "the engine")
    if ids and len(missing) == len(ids):
        seen = ""
        if queries:
            hits = engine.search_batch([next(iter(queries.values()))], 1, collapse="document")[0]
            if hits:
                seen = f"; the index's doc_ids look like {(hits[0].metadata or {}).get('parent_doc_id', hits[0].doc_id)!r}"
        raise ConfigError(f"none of the {len(ids)} relevant documents of the qrels is a doc_id of index {name} "
                          f"(the qrels name e.g. {ids[0]!r}{seen}): every measure would be 0. The qrels must name the "
                          "index's doc_ids; an index built from a corpus file by an older drgym put '<format>-' in "
                          "front of the file's ids (rebuild it with drgym index build --force).")
    if missing:
        log.warning("%d of the %d relevant documents of the qrels are not doc_ids of index %s (e.g. %s): they count "
                    "as misses.", len(missing), len(ids), name, ", ".join(repr(m) for m in missing[:5]))
    return {"relevant_docs": len(ids), "relevant_docs_not_in_index": len(missing), "missing_examples": missing[:5]}


def read_queries(path: str | Path) -> dict[str, str]:
    """Read queries: JSONL ``{"qid", "query"}`` (``.jsonl``) or TSV ``qid<TAB>query`` (any other suffix).

    Returns:
        ``{qid: query}`` in file order.

    Raises:
        CorpusError: missing file, a malformed line, an empty query, a repeated qid, or no query.
    """
    out: dict[str, str] = {}
    jsonl = Path(path).suffix == ".jsonl"
    for n, line in nonblank_lines(path, "queries"):
        if jsonl:
            try:
                row = json.loads(line)
                qid, query = str(row["qid"]), row["query"]
            except (ValueError, KeyError, TypeError):
                raise CorpusError(f"{path}:{n}: a JSONL query line is {{\"qid\": ..., \"query\": ...}}, "
                                  f"got {line[:80]!r}.") from None
        else:
            qid, sep, query = line.partition("\t")
            if not sep:
                raise CorpusError(f"{path}:{n}: a TSV query line is 'qid<TAB>query', got no tab: {line[:80]!r}.")
        if not isinstance(query, str) or not query.strip():
            raise CorpusError(f"{path}:{n}: query {qid!r} is empty.")
        if qid in out:
            raise CorpusError(f"{path}:{n}: query id {qid!r} appears twice.")
        check_trec_id(qid, "query id")
        out[qid] = query.strip()
    if not out:
        raise CorpusError(f"{path} holds no query.")
    return out


def write_run(path: str | Path, run: Run, tag: str) -> None:
    """Write a TREC run file (``qid Q0 docid rank score tag``; ranks from 1, atomically).

    Raises:
        ConfigError: an id or the tag is empty or holds whitespace, or a docid is repeated
            within a query (``trec_eval`` would keep only one of them).
    """
    check_trec_id(tag, "run tag")
    lines = []
    for qid, hits in run.items():
        check_trec_id(qid, "query id")
        seen: set[str] = set()
        for rank, (docid, score) in enumerate(hits, 1):
            check_trec_id(docid, "document id")
            if docid in seen:
                raise ConfigError(f"run {tag}: document {docid!r} is ranked twice for query {qid!r}.")
            seen.add(docid)
            lines.append(f"{qid} Q0 {docid} {rank} {float(score):.6f} {tag}\n")
    atomic_write_text(path, "".join(lines))


def read_run(path: str | Path) -> Run:
    """Read a TREC run file; hits are ordered by ``rank``.

    Raises:
        CorpusError: missing file, a line without six fields, a bad rank or score, or a
            docid ranked twice for one query.
    """
    rows: dict[str, list[tuple[int, str, float]]] = {}
    for n, line in nonblank_lines(path, "run"):
        parts = line.split()
        if len(parts) != 6:
            raise CorpusError(f"{path}:{n}: a run line is 'qid Q0 docid rank score tag' (6 fields), got {len(parts)}.")
        qid, _, docid, rank, score, _tag = parts
        try:
            r, s = int(rank), float(score)
        except ValueError:
            raise CorpusError(f"{path}:{n}: rank must be an integer and score a number, got {rank!r}, {score!r}.") from None
        if not math.isfinite(s):
            raise CorpusError(f"{path}:{n}: score {score!r} is not a finite number.")
        if any(d == docid for _, d, _ in rows.get(qid, [])):
            raise CorpusError(f"{path}:{n}: document {docid!r} is ranked twice for query {qid!r}.")
        rows.setdefault(qid, []).append((r, docid, s))
    return {q: [(d, s) for _, d, s in sorted(v)] for q, v in rows.items()}


def score_run(qrels: Qrels, run: Run, measures: Iterable[str] = MEASURES) -> dict[str, Any]:
    """Score a run against qrels with ``ir-measures`` (see the module docstring).

    The score of each hit orders the hits, as in ``trec_eval`` (ties, and scores within
    float precision of each other, broken by docid); write runs with clearly decreasing
    scores (:func:`run_engine` does) so that rank and score agree.

    Args:
        qrels: ``{qid: {docid: rel}}``.
        run: ``{qid: [(docid, score), ...]}``.
        measures: ``ir-measures`` names, default :data:`MEASURES`.

    Returns:
        ``{"overall": {name: mean}, "per_query": {qid: {name: value}}, "judged_queries": n,
        "unanswered_queries": [qids], "unjudged_queries": n}``; names as in
        :data:`METRIC_NAMES` (e.g. ``recall@10``). Means are over the judged queries,
        an unanswered one counting 0.

    Raises:
        ConfigError: no query of the qrels has a relevant document, or an unknown measure.
    """

    try:
        ms = [ir_measures.parse_measure(m) for m in measures]
    except Exception as e:  # noqa: BLE001 - ir-measures raises plain ValueError/NameError/SyntaxError
        raise ConfigError(f"unknown retrieval measure in {list(measures)}: {e}") from e
    judged = [q for q, docs in qrels.items() if any(r > 0 for r in docs.values())]
    if not judged:
        raise ConfigError("the qrels hold no relevant document (rel > 0): nothing to score.")
    names = {m: METRIC_NAMES.get(str(m), str(m)) for m in ms}
    per_query = {q: {names[m]: 0.0 for m in ms} for q in judged}
    qrel_rows = [ir_measures.Qrel(q, d, int(r)) for q in judged for d, r in qrels[q].items()]
    run_rows = [ir_measures.ScoredDoc(q, d, float(s)) for q in judged for d, s in run.get(q, [])]
    for m in ir_measures.iter_calc(ms, qrel_rows, run_rows):
        per_query[m.query_id][names[m.measure]] = float(m.value)
    overall = {names[m]: sum(v[names[m]] for v in per_query.values()) / len(judged) for m in ms}
    return {
        "overall": overall,
        "per_query": per_query,
        "judged_queries": len(judged),
        "unanswered_queries": [q for q in judged if not run.get(q)],
        "unjudged_queries": sum(1 for q in run if q not in judged),
    }


def run_engine(engine: Any, queries: dict[str, str], *, method: str, k: int = RUN_DEPTH,
               batch_size: int = 32) -> Run:
    """Rank the top-``k`` documents of each query with a local engine (document level).

    Args:
        engine: a :class:`~drgym.search.local.LocalSearchEngine` (anything with
            ``search_batch(queries, k, method=, collapse=)`` returning results whose
            ``metadata["parent_doc_id"]`` names the document).
        queries: ``{qid: query}``.
        method: ``dense``, ``bm25`` or ``hybrid``.
        k: documents per query (at most the engine's ``max_k``).

    Returns:
        ``{qid: [(doc_id, score), ...]}`` best first, with ``score = k + 1 - rank``: the
        engine's own scores tie often (reciprocal-rank fusion gives equal scores to
        documents at equal ranks), ``trec_eval`` breaks ties by docid, and it does not
        tell apart scores a few float ulps apart; rank-derived scores make every tool
        read the engine's order.

    Raises:
        BadQueryError: as :meth:`~drgym.search.local.LocalSearchEngine.search_batch`.
    """
    qids = list(queries)
    out: Run = {}
    for i in range(0, len(qids), batch_size):
        chunk = qids[i: i + batch_size]
        results = engine.search_batch([queries[q] for q in chunk], k, method=method, collapse="document")
        for qid, hits in zip(chunk, results):
            docs = [(h.metadata or {}).get("parent_doc_id") or h.doc_id.split("#p")[0] for h in hits]
            out[qid] = [(d, float(k - i)) for i, d in enumerate(docs)]
    return out


def evaluate_engine(engine: Any, qrels: Qrels, queries: dict[str, str], methods: Iterable[str], *,
                    run_out: str | Path | None = None, out: str | Path | None = None,
                    k: int = RUN_DEPTH) -> dict[str, Any]:
    """Run and score each method; write the run files and a metrics JSON.

    Args:
        engine: a local engine (see :func:`run_engine`).
        qrels, queries: as read by :func:`read_qrels` / :func:`read_queries`.
        methods: search methods to evaluate.
        run_out: TREC run file; with several methods, one file each, named
            ``<stem>.<method><suffix>``.
        out: metrics JSON (``{"level": "document", "k": k, "methods": {method: score_run(...) +
            {"run_file"}}, ...}``).

    Returns:
        The metrics dict written to ``out``; ``qrels_check`` holds :func:`check_qrels_ids`'s
        counts (relevant documents that are not in the index count as misses, with a
        warning).

    Raises:
        ConfigError: a qrels query has no query text (it could not be run), or no
            relevant document of the qrels is a doc_id of the index
            (:func:`check_qrels_ids`).
    """
    missing = [q for q in qrels if q not in queries]
    if missing:
        raise ConfigError(f"{len(missing)} qrels queries have no text in the queries file (e.g. {missing[0]!r}).")
    methods = list(methods)
    check = check_qrels_ids(engine, qrels, queries)
    res: dict[str, Any] = {"level": "document", "k": k, "queries": len(queries), "qrels_check": check, "methods": {}}
    for method in methods:
        run = run_engine(engine, queries, method=method, k=k)
        entry = score_run(qrels, run)
        if run_out is not None:
            p = Path(run_out)
            if len(methods) > 1:
                p = p.with_name(f"{p.stem}.{method}{p.suffix}")
            write_run(p, run, tag=f"drgym-{method}")
            entry["run_file"] = str(p)
        res["methods"][method] = entry
    if out is not None:
        atomic_write_json(out, res)
    return res
