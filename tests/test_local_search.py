"""LocalSearchEngine over the real wiki-default index (built once per session by the
``default_engine`` fixture in conftest.py): hand-checked hits, fetch, validation,
threads, two processes, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from drgym.errors import BadQueryError, DocumentNotFoundError
from drgym.search.base import SearchBackend
from drgym.types import Document, SearchResult

# Questions with the titles of paragraphs that answer them, checked by hand.
HOTPOT = [
    ("If Gallu is a demon Lilu is what?", {"Alû", "Lilu (mythology)"}),
    ("Who was the wife of Lothair II of Lotharingia?", {"Teutberga", "Waldrada of Lotharingia"}),
]


def titles(results):
    return [r.title for r in results]


def test_is_a_search_backend(default_engine):
    assert isinstance(default_engine, SearchBackend)
    assert default_engine.deterministic and default_engine.max_k == 100
    m = default_engine.manifest
    assert m.n_documents == 20_036 and m.corpus == "wiki-default" and m.factory == "Flat"
    assert m.timings["passages_encoded_live"] == 0


@pytest.mark.parametrize("method", ["dense", "bm25", "hybrid"])
def test_supporting_paragraph_in_top5(default_engine, method):
    res = default_engine.search_batch(["If Gallu is a demon Lilu is what?"], 5, method=method)[0]
    assert len(res) == 5
    assert "Lilu (mythology)" in titles(res)
    assert [r.rank for r in res] == [1, 2, 3, 4, 5]
    assert all(res[i].score >= res[i + 1].score for i in range(4))
    assert all(isinstance(r, SearchResult) and r.url.startswith("https://en.wikipedia.org/wiki/") for r in res)
    assert all(r.metadata["method"] == method for r in res)


@pytest.mark.parametrize("method", ["dense", "bm25", "hybrid"])
def test_known_item_queries(default_engine, method):
    e = default_engine.with_method(method)
    # 2Wiki paragraphs: both wives of Lothair II are in the top-5 of every method.
    top = titles(e.search("Who was the wife of Lothair II of Lotharingia?", 5))
    assert {"Teutberga", "Waldrada of Lotharingia"} <= set(top)
    assert e.search("Teutberga queen Lotharingia", 3)[0].title == "Teutberga"
    # ovos lead summaries
    assert "Paris" in titles(e.search("capital of France", 5))


def test_fetch_returns_whole_document(default_engine):
    # A long document split into several passages: a hit is one passage, fetch gives all.
    docs = default_engine.docstore
    rows = docs._query("SELECT doc_id, count(*) c FROM passages GROUP BY doc_id HAVING c >= 2 ORDER BY doc_id LIMIT 1")
    assert rows, "wiki-default should have at least one document longer than the encoder window"
    doc_id = rows[0][0]
    doc = default_engine.get(doc_id)
    passages = docs._query("SELECT text FROM passages WHERE doc_id = ? ORDER BY row", (doc_id,))
    assert len(passages) >= 2 and all(p[0] in doc.text for p in passages)
    assert len(doc.text) > max(len(p[0]) for p in passages)
    hit = default_engine.search(passages[1][0][:300], 10)
    assert any(r.metadata["parent_doc_id"] == doc_id and r.doc_id == f"{doc_id}#p1" for r in hit)
    fetched = default_engine.fetch(doc.url)
    assert isinstance(fetched, Document) and fetched == doc
    with pytest.raises(DocumentNotFoundError, match="URL not found"):
        default_engine.fetch("https://en.wikipedia.org/wiki/Surely_not_a_page_in_wiki_default")


def test_batch_equals_single(default_engine):
    qs = [q for q, _ in HOTPOT] + ["Teutberga", "capital of France", "Évian-les-Bains 水"]
    batch = default_engine.search_batch(qs, 7)
    for q, b in zip(qs, batch):
        single = default_engine.search(q, 7)
        assert [(r.doc_id, r.score) for r in single] == [(r.doc_id, r.score) for r in b]


def test_request_validation_and_odd_queries(default_engine):
    for k in (0, -1, 10**6):
        with pytest.raises(BadQueryError, match="k must be between 1 and 100"):
            default_engine.search("demon", k)
    for q in ("", "  ", "\n\t"):
        with pytest.raises(BadQueryError, match="empty"):
            default_engine.search(q, 3)
    long_q = ("Lilu is a demon in Mesopotamian mythology. " * 300)[:10_000]
    for method in ("dense", "bm25", "hybrid"):
        res = default_engine.search_batch([long_q], 5, method=method)[0]
        assert len(res) == 5 and "Lilu (mythology)" in titles(res)  # truncated, not rejected
    assert len(default_engine.search("Ünïcödé 日本語 Москва ☃", 5)) == 5
    assert len(default_engine.search(long_q * 10, 3)) == 3


def test_concurrent_threads_match_sequential(default_engine):
    qs = ["If Gallu is a demon Lilu is what?", "Teutberga", "Lothair II", "Riemann integral",
          "Journal of Mathematical Physics", "Demon Dice", "Maha Sona", "Wangliang"]
    expected = {q: [r.doc_id for r in default_engine.search(q, 10)] for q in qs}
    got, errors = {}, []

    def work(q):
        try:
            for _ in range(3):
                got.setdefault(q, []).append([r.doc_id for r in default_engine.search(q, 10)])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(q,)) for q in qs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(all(run == expected[q] for run in got[q]) for q in qs)


def test_identical_rankings_in_another_process(default_engine):
    """A second process (the ``drgym search`` CLI) loads the same index and ranks alike."""
    q = "If Gallu is a demon Lilu is what?"
    mine = [(r.doc_id, round(r.score, 6)) for r in default_engine.search(q, 10)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "drgym", "search", q, "-k", "10", "--index", str(default_engine.folder), "--json",
         "--method", "hybrid"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = [(r["doc_id"], round(r["score"], 6)) for r in json.loads(proc.stdout)]
    assert theirs == mine


def test_cli_fetch_and_table(default_engine):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "drgym", "fetch", "https://en.wikipedia.org/wiki/Lilu_(mythology)", "--index",
         str(default_engine.folder), "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["title"] == "Lilu (mythology)" and doc == default_engine.fetch(doc["url"]).to_dict()
    proc = subprocess.run(
        [sys.executable, "-m", "drgym", "fetch", "https://example.org/nothing", "--index", str(default_engine.folder)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 1 and "URL not found" in proc.stderr


def test_cli_search_table(default_engine):
    from typer.testing import CliRunner

    from drgym.cli import app

    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["search", "Teutberga queen Lotharingia", "-k", "3", "--index",
                                   str(default_engine.folder), "--method", "bm25", "--width", "60"])
    assert res.exit_code == 0, res.output
    assert "Teutberga" in res.output and "https://en.wikipedia.org/wiki/Teutberga" in res.output
    assert "(bm25)" in res.output
    bad = CliRunner().invoke(app, ["search", "   ", "--index", str(default_engine.folder)])
    assert bad.exit_code == 2 and "empty" in bad.output


def test_open_by_corpus_name_when_one_index_matches(default_engine, tmp_path, monkeypatch):
    """``--index wiki-default`` works like the full name when one built index starts with it;
    several matches are refused with the list."""
    from drgym.errors import ConfigError, IndexNotFoundError
    from drgym.search.local import LocalSearchEngine

    home = tmp_path / "home"
    (home / "indexes").mkdir(parents=True)
    monkeypatch.setenv("DRGYM_HOME", str(home))
    full = default_engine.folder.name
    assert full.startswith("wiki-default--")
    (home / "indexes" / full).symlink_to(default_engine.folder)
    eng = LocalSearchEngine.open("wiki-default", method="bm25")
    try:
        assert eng.folder.name == full
        assert eng.search("Teutberga queen Lotharingia", 1) == default_engine.with_method("bm25").search(
            "Teutberga queen Lotharingia", 1)
    finally:
        eng.close()
    with pytest.raises(IndexNotFoundError):
        LocalSearchEngine.open("wiki")  # a prefix of the corpus name is not enough
    (home / "indexes" / "wiki-default--other--HNSW32").symlink_to(default_engine.folder)
    with pytest.raises(ConfigError, match=r"'wiki-default' matches 2 built indexes: wiki-default--.*give the full name"):
        LocalSearchEngine.open("wiki-default")


# -- results collapsed to documents (the default) or passages ------------------------------

LONG_DOC = "Amri language"  # HotpotQA paragraph of 2,693 characters: 4 passages in the index


def test_a_long_document_fills_the_passages_but_counts_once_as_a_document(hotpotqa_engine):
    e = hotpotqa_engine
    assert e.collapse == "document"
    doc = e.get("hotpotqa-00023")
    assert doc.title == LONG_DOC and len(e.docstore._query("SELECT 1 FROM passages WHERE doc_id = ?", (doc.doc_id,))) == 4
    for method in ("dense", "bm25", "hybrid"):
        passages = e.search_batch([LONG_DOC], 3, method=method, collapse="passage")[0]
        assert {r.url for r in passages} == {doc.url}, method  # three passages of one URL
        docs = e.search_batch([LONG_DOC], 3, method=method)[0]
        urls = [r.url for r in docs]
        assert len(set(urls)) == len(urls) and urls[0] == doc.url, (method, urls)
        assert docs[0] == passages[0]  # the best passage stands for its document (max score)
        assert [r.rank for r in docs] == list(range(1, len(docs) + 1))
        assert all(docs[i].score >= docs[i + 1].score for i in range(len(docs) - 1))
        assert all(r.metadata["parent_doc_id"] != doc.doc_id for r in docs[1:])
    # dense and hybrid rank every passage: k distinct documents always come back (over-fetch)
    for method in ("dense", "hybrid"):
        for k in (3, 10, 40):
            docs = e.search_batch([LONG_DOC, "Notis Sfakianakis Greek singer"], k, method=method)
            assert all(len({r.url for r in res}) == len(res) == k for res in docs), (method, k)
    # BM25 ranks only passages sharing a term: fewer documents than k is all there is
    only = e.search_batch(["Sfakianakis"], 3, method="bm25")[0]
    assert [r.title for r in only] == ["Notis Sfakianakis"]
    assert len(e.search_batch(["Sfakianakis"], 3, method="bm25", collapse="passage")[0]) == 3
    # the mode is an engine option too, kept by with_method
    pe = e.with_method("hybrid", collapse="passage")
    assert pe.collapse == "passage" and pe.with_method("dense").collapse == "passage"
    assert pe.search(LONG_DOC, 3) == e.search_batch([LONG_DOC], 3, collapse="passage")[0]
    with pytest.raises(BadQueryError, match="collapse must be one of document, passage"):
        e.search_batch([LONG_DOC], 3, collapse="sentence")


def test_no_repeated_url_in_the_top10_of_real_questions(default_engine):
    """hotpotqa-dev (79) and drb-en (40) over wiki-default, hybrid: as passages 13 of the 119
    questions get one URL twice in their top 10; collapsed to documents, none does, and
    every question still gets 10 results."""
    from drgym.envs.task_loaders import load_tasks

    qs = [t.question for name in ("hotpotqa-dev", "drb-en") for t in load_tasks(name)]
    assert len(qs) == 119

    def repeated(res):
        return sum(len({r.url for r in hits}) < len(hits) for hits in res)

    assert repeated(default_engine.search_batch(qs, 10, collapse="passage")) == 13
    docs = default_engine.search_batch(qs, 10)
    assert repeated(docs) == 0 and {len(h) for h in docs} == {10}


def test_deepresearch_env_numbers_distinct_sources(hotpotqa_engine):
    """The DeepResearch env numbers sources by URL: passages of one long document were one
    source shown three times; collapsed to documents, a search shows three sources."""
    import gymnasium as gym

    import drgym.envs  # noqa: F401

    for engine, labels in ((hotpotqa_engine, ["[1]", "[2]", "[3]"]),
                           (hotpotqa_engine.with_method("hybrid", collapse="passage"), ["[1]", "[1]", "[1]"])):
        env = gym.make("drgym/DeepResearch-v0", backend=engine, top_k=3)
        env.reset(options={"task_index": 0})
        obs, *_ = env.step("<search>Amri language</search>")
        shown = [line.split(" ", 1)[0] for line in obs.split("<information>", 1)[1].splitlines() if line.startswith("[")]
        assert shown == labels, obs[:500]
        assert len(env.unwrapped.sources) == len(set(labels))
        env.close()


def test_cli_search_collapse(hotpotqa_engine):
    from typer.testing import CliRunner

    from drgym.cli import app

    def urls(*extra):
        res = CliRunner().invoke(app, ["search", LONG_DOC, "-k", "3", "--index", str(hotpotqa_engine.folder), "--json", *extra])
        assert res.exit_code == 0, res.output
        return [r["url"] for r in json.loads(res.output)]

    assert len(set(urls())) == 3
    assert len(set(urls("--collapse", "passage"))) == 1
    bad = CliRunner().invoke(app, ["search", LONG_DOC, "--index", str(hotpotqa_engine.folder), "--collapse", "sentence"])
    assert bad.exit_code == 2 and "collapse must be one of document, passage" in bad.output
