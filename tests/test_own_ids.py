"""A user's corpus keeps its own ids and gets no made-up URLs; retrieval evaluation refuses
qrels that name none of the index's documents.

The corpus is real: the first 120 rows of FlashRAG's wiki-18 sample shipped with drgym
(``{"id": "0", "contents": ...}``), written as a user's own file, built with the shipped
MiniLM (its embeddings come from the shipped cache).
"""

from __future__ import annotations

import json
import logging

import pytest

from drgym.corpus.named import CORPORA_DIR

SAMPLE = CORPORA_DIR / "flashrag_wiki18_sample.jsonl"
N = 120


def _rows(n: int = N) -> list[dict]:
    with open(SAMPLE, encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


@pytest.fixture(scope="module")
def own_corpus(tmp_path_factory):
    """``mine.jsonl``: 120 wiki-18 rows with their own ids "0".."119"; row 5 carries its own url."""
    rows = _rows()
    assert [r["id"] for r in rows] == [str(i) for i in range(N)]
    rows[5] = dict(rows[5], url="https://example.org/docs/five")
    path = tmp_path_factory.mktemp("own") / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def own_index(own_corpus, session_drgym_home):
    """The index of ``mine.jsonl`` as ``drgym index build --corpus mine.jsonl --format wiki18`` builds it."""
    from drgym.index.build import IndexSpec, build_index
    from drgym.search.local import LocalSearchEngine

    res = build_index(IndexSpec(corpus=str(own_corpus), format="wiki18", name="own-ids"))
    engine = LocalSearchEngine(res.folder, method="bm25")
    yield engine
    engine.close()


def _title(row: dict) -> str:
    return row["contents"].split("\n", 1)[0].strip('"')


def test_build_keeps_the_rows_ids_and_makes_up_no_url(own_index):
    rows = _rows()
    m = own_index.manifest
    assert m.n_documents == N and m.chunking["id_prefix"] == "" and m.chunking["urls"] == "corpus"
    doc = own_index.get("0")  # {"id": "0"} is doc_id "0", not "wiki18-0"
    assert doc.title == _title(rows[0]) == "Evan Morris"
    assert doc.url == "drgym://doc/0"  # no https://en.wikipedia.org/wiki/Evan_Morris for a user's corpus
    assert own_index.get("5").url == "https://example.org/docs/five"  # the row's own url is kept
    with pytest.raises(Exception, match="No document with doc_id 'wiki18-0'"):
        own_index.get("wiki18-0")
    # what the agent sees and cites: the search result's url, which fetch takes back
    hit = own_index.search("Evan Morris lobbyist Genentech", 1)[0]
    assert (hit.metadata["parent_doc_id"], hit.url) == ("0", "drgym://doc/0")
    assert own_index.fetch(hit.url).doc_id == "0"
    urls = [own_index.get(str(i)).url for i in range(N)]
    assert not any("wikipedia.org" in u for u in urls)


def test_wikipedia_urls_when_the_corpus_is_wikipedia(own_corpus, own_index):
    """--wikipedia-urls: a row without a url gets its title's Wikipedia URL; another index."""
    from drgym.index.build import IndexSpec, build_index
    from drgym.search.local import LocalSearchEngine

    res = build_index(IndexSpec(corpus=str(own_corpus), format="wiki18", name="own-ids-wiki", wikipedia_urls=True))
    assert res.built and res.manifest.chunking["urls"] == "wikipedia"
    e = LocalSearchEngine(res.folder, method="bm25")
    try:
        assert e.get("0").url == "https://en.wikipedia.org/wiki/Evan_Morris"
        assert e.get("5").url == "https://example.org/docs/five"
        assert e.manifest.corpus_fingerprint != own_index.manifest.corpus_fingerprint
    finally:
        e.close()


def test_an_index_built_with_prefixed_ids_is_not_reused(own_corpus, own_index):
    """An index of the same file whose manifest does not say how ids and URLs were read
    (built before they were kept) is not taken as up to date."""
    from dataclasses import replace

    from drgym.index.build import same_identity

    old = replace(own_index.manifest, chunking={k: v for k, v in own_index.manifest.chunking.items()
                                                if k not in ("id_prefix", "urls")})
    assert same_identity(own_index.manifest, own_index.manifest)
    assert not same_identity(old, own_index.manifest)


def test_shipped_corpora_keep_their_ids_and_wikipedia_urls():
    from drgym.corpus.named import load_named_corpus

    docs = load_named_corpus("flashrag")
    assert docs[0].doc_id == "flashrag-0" and docs[0].url == "https://en.wikipedia.org/wiki/Evan_Morris"
    hp = load_named_corpus("hotpotqa")
    assert hp[0].doc_id == "hotpotqa-00000" and hp[0].url.startswith("https://en.wikipedia.org/wiki/")


def test_other_own_formats_keep_ids_and_get_no_made_up_url(tmp_path):
    """web rows keep their id (FineWeb's own); a {"title", "text"} JSON list (read as
    hipporag) gets no Wikipedia URL unless the corpus is said to be Wikipedia."""
    from drgym.corpus.readers import read_corpus
    from drgym.errors import ConfigError

    web = tmp_path / "web.jsonl"
    web.write_text(json.dumps({"id": "<urn:uuid:1>", "url": "https://a.example/x", "text": "A page."}) + "\n"
                   + json.dumps({"text": "No id, no url."}) + "\n")
    docs = list(read_corpus(web))
    assert [(d.doc_id, d.url) for d in docs] == [("<urn:uuid:1>", "https://a.example/x"), ("1", "")]
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps([{"title": "Q3 plan", "text": "Ship it."},
                                 {"title": "Wiki", "text": "x", "url": "https://w.example/p"}]))
    assert [d.url for d in read_corpus(notes)] == ["", "https://w.example/p"]
    assert [d.url for d in read_corpus(notes, wikipedia_urls=True)] == ["https://en.wikipedia.org/wiki/Q3_plan",
                                                                       "https://w.example/p"]
    with pytest.raises(ConfigError, match="Wikipedia URLs from titles apply to wiki18 and hipporag rows only"):
        read_corpus(web, wikipedia_urls=True)


def test_a_report_citing_a_document_without_url_is_counted():
    """drgym://doc/<id> (shown for a document without URL) is a URL for citations."""
    from drgym.corpus.urls import find_urls
    from drgym.envs.deepresearch import extract_citations, resolve_markers

    report = resolve_markers("Evan Morris lobbied for Genentech [1]. He died in 2015 (drgym://doc/0).",
                             {1: "drgym://doc/0"})
    assert find_urls(report) == ["drgym://doc/0"]
    claims = extract_citations(report, {1: "drgym://doc/0"})
    assert [c["urls"] for c in claims] == [["drgym://doc/0"], ["drgym://doc/0"]]


# -- drgym search eval -------------------------------------------------------------------------


def _eval_files(tmp_path, ids: list[str]):
    rows = _rows()
    queries = tmp_path / "queries.tsv"
    queries.write_text("".join(f"q{i}\t{_title(rows[i])}\n" for i in range(len(ids))), encoding="utf-8")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"q{i} 0 {d} 1\n" for i, d in enumerate(ids)), encoding="utf-8")
    return qrels, queries


def test_eval_scores_qrels_in_the_corpus_own_ids(tmp_path, own_index):
    from drgym.evaluation.retrieval import evaluate_engine, read_qrels, read_queries

    qrels, queries = _eval_files(tmp_path, [str(i) for i in range(10)])
    res = evaluate_engine(own_index, read_qrels(qrels), read_queries(queries), ["bm25"], k=10)
    assert res["qrels_check"] == {"relevant_docs": 10, "relevant_docs_not_in_index": 0, "missing_examples": []}
    assert res["methods"]["bm25"]["overall"]["recall@10"] >= 0.9  # each title finds its own page


def test_eval_refuses_qrels_naming_no_index_document(tmp_path, own_index, caplog):
    from typer.testing import CliRunner

    from drgym.cli import app
    from drgym.errors import ConfigError
    from drgym.evaluation.retrieval import evaluate_engine, read_qrels, read_queries

    qrels, queries = _eval_files(tmp_path, [f"wiki18-{i}" for i in range(10)])
    with pytest.raises(ConfigError, match=r"none of the 10 relevant documents of the qrels is a doc_id of index "
                                          r"own-ids \(the qrels name e\.g\. 'wiki18-0'; the index's doc_ids look like '0'\)"):
        evaluate_engine(own_index, read_qrels(qrels), read_queries(queries), ["bm25"], k=10)
    r = CliRunner().invoke(app, ["search", "eval", "--qrels", str(qrels), "--queries", str(queries),
                                 "--index", str(own_index.folder), "-m", "bm25", "-k", "10"])
    assert r.exit_code == 2 and "none of the 10 relevant documents" in r.output, r.output
    # some missing: scored, with a warning and the count
    qrels, queries = _eval_files(tmp_path, ["0", "1", "2", "wiki18-3"])
    with caplog.at_level(logging.WARNING, logger="drgym.evaluation.retrieval"):
        res = evaluate_engine(own_index, read_qrels(qrels), read_queries(queries), ["bm25"], k=10)
    assert res["qrels_check"]["relevant_docs_not_in_index"] == 1
    assert "1 of the 4 relevant documents of the qrels are not doc_ids of index own-ids (e.g. 'wiki18-3')" in caplog.text


def test_wikipedia_urls_option_of_the_cli_is_refused_for_other_formats(tmp_path):
    """``drgym index build --wikipedia-urls`` on web rows: one line, exit 2, before any model loads."""
    from typer.testing import CliRunner

    from drgym.cli import app

    web = tmp_path / "web.jsonl"
    web.write_text(json.dumps({"id": "a", "url": "https://a.example/", "text": "A page."}) + "\n")
    r = CliRunner().invoke(app, ["index", "build", "--corpus", str(web), "--wikipedia-urls", "--root", str(tmp_path / "ix")])
    assert r.exit_code == 2, r.output
    assert "--wikipedia-urls applies to wiki18 and hipporag corpus files, whose rows may lack a URL; this corpus is web" \
        in " ".join(r.output.split())
    assert not (tmp_path / "ix" / "web--all-MiniLM-L6-v2--Flat").exists()
