"""Hybrid search fuses at a fixed depth: its ranking of a query does not depend on k.

Over the real wiki-default index (the ``default_engine`` fixture) and real questions, the
top k at every k is the first k at k=100, with the same fused score per document, in both
collapse modes, alone and in a batch.
"""

from __future__ import annotations

import pytest

KS = (1, 5, 10, 50, 100)


@pytest.fixture(scope="module")
def questions():
    """20 real questions: 16 of hotpotqa-dev, 4 of drb-en (long research prompts)."""
    from drgym.envs.task_loaders import load_tasks

    qs = [t.question for t in load_tasks("hotpotqa-dev")[:16]] + [t.question for t in load_tasks("drb-en")[:4]]
    assert len(qs) == 20 and len(set(qs)) == 20
    return qs


def _key(results):
    return [(r.doc_id, r.metadata["parent_doc_id"], r.score) for r in results]


@pytest.mark.parametrize("method, collapse", [("hybrid", "document"), ("hybrid", "passage"),
                                              ("dense", "document"), ("bm25", "document")])
def test_top_k_is_the_prefix_of_top_100_with_the_same_scores(default_engine, questions, method, collapse):
    e = default_engine.with_method(method, collapse=collapse)
    assert e.fusion_depth == 100  # max(rrf_depth 100, max_k 100)
    full = e.search_batch(questions, 100)
    assert all(len(res) == 100 for res in full)  # wiki-default's union of two top-100s holds 100 documents
    for k in KS:
        got = e.search_batch(questions, k)
        for q, res, ref in zip(questions, got, full):
            assert len(res) == k
            assert _key(res) == _key(ref[:k]), (method, collapse, k, q)
            assert [r.rank for r in res] == list(range(1, k + 1))


def test_a_document_has_one_fused_score_at_every_k(default_engine, questions):
    """The score a document gets does not move with k, one query at a time too."""
    e = default_engine.with_method("hybrid")
    scores: dict[tuple[str, str], set[float]] = {}
    for q in questions[:3]:
        for k in KS:
            for r in e.search(q, k):
                scores.setdefault((q, r.metadata["parent_doc_id"]), set()).add(r.score)
    assert len(scores) == 3 * 100
    assert all(len(s) == 1 for s in scores.values())


def test_fusion_depth_is_fixed_by_the_engine_not_by_the_call(default_engine, questions):
    """An engine of larger max_k fuses deeper at every k, so its top 10 is still its k=200
    prefix; and the depth is part of the engine's identity."""
    from drgym.search.local import LocalSearchEngine

    e = LocalSearchEngine(default_engine.folder, method="hybrid", max_k=200, _shared=default_engine._shared)
    assert e.fusion_depth == 200
    top200 = e.search_batch(questions[:4], 200)
    for k in (10, 100):
        assert [_key(r) for r in e.search_batch(questions[:4], k)] == [_key(r[:k]) for r in top200]
    ident = e.identity()
    assert (ident["max_k"], ident["rrf_depth"]) == (200, 100)


def test_served_hybrid_top_10_is_the_first_10_of_top_100(default_engine, questions):
    """What an agent sees through ``drgym serve``'s /search and /retrieve: the same prefix."""
    import httpx
    from server_helpers import running_server

    from drgym.search.wire import ServerSettings, decode_b64_json

    e = default_engine.with_method("hybrid")
    with running_server(e, settings=ServerSettings(cache_mb=0)) as srv:
        for q in questions[:3]:
            got = {k: [decode_b64_json(s)["id"] for s in httpx.get(f"{srv.url}/search", params={"query": q, "k": k},
                                                                     timeout=120).json()["results"]]
                   for k in (10, 100)}
            assert len(got[100]) == 100 and got[10] == got[100][:10], q
        r = {k: httpx.post(f"{srv.url}/retrieve", json={"queries": questions[:3], "topk": k, "return_scores": True},
                           timeout=120).json()["result"] for k in (10, 100)}
        assert [[(h["document"]["id"], h["score"]) for h in hs] for hs in r[10]] == \
               [[(h["document"]["id"], h["score"]) for h in hs[:10]] for hs in r[100]]
