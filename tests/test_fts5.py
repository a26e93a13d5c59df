"""BM25 on disk with SQLite FTS5 (``bm25_engine="fts5"``): built streaming, searched from
its file, ranking like bm25s on real text, and hybrid search fused the same way."""

from __future__ import annotations

import json
import sqlite3
import tracemalloc

import numpy as np
import pytest
from typer.testing import CliRunner

from drgym.errors import ConfigError, CorruptIndexError
from drgym.index.fts5 import FTS5_FILE, FTS5BM25Index, write_fts5


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from drgym.search.local import LocalSearchEngine

    root = tmp_path_factory.mktemp("idx")
    a = LocalSearchEngine.from_corpus("hotpotqa", method="bm25", root=root, device="cpu")
    b = LocalSearchEngine.from_corpus("hotpotqa", method="bm25", root=root, device="cpu", bm25_engine="fts5")
    yield a, b
    a.close()
    b.close()


def test_fts5_ranks_like_bm25s_on_real_questions(engines):
    from drgym.envs.task_loaders import load_tasks

    bm25s, fts5 = engines
    assert fts5.folder.name.endswith("--fts5") and fts5.folder != bm25s.folder
    assert fts5.manifest.bm25["engine"] == "fts5" and (fts5.folder / FTS5_FILE).is_file()
    assert not (fts5.folder / "bm25").exists()  # no bm25s matrix in an FTS5 index
    questions = [t.question for t in load_tasks("hotpotqa-dev")[:60]]
    overlaps, top1 = [], []
    for q in questions:
        a = [h.doc_id for h in bm25s.search(q, 10)]
        b = [h.doc_id for h in fts5.search(q, 10)]
        assert len(b) == len(set(b)) and all(h.score > 0 for h in fts5.search(q, 10))
        if len(a) == len(b) == 10:
            overlaps.append(len(set(a) & set(b)) / 10)
            top1.append(a[0] == b[0])
    assert len(overlaps) >= 50
    # FTS5's bm25() is Okapi with k1 1.2 and a clamped IDF, bm25s Lucene's with k1 1.5: alike, not equal
    assert np.mean(overlaps) >= 0.85 and np.mean(top1) >= 0.8, (np.mean(overlaps), np.mean(top1))
    # the same query ranks the same every time, ties by passage_id
    assert [h.doc_id for h in fts5.search(questions[0], 10)] == [h.doc_id for h in fts5.search(questions[0], 10)]


def test_hybrid_over_fts5_fuses_like_over_bm25s(engines):
    from drgym.search.local import LocalSearchEngine

    _, fts5 = engines
    hybrid = LocalSearchEngine(fts5.folder, method="hybrid", device="cpu")
    hits = hybrid.search("Lilu demon mythology", 5)
    assert hits[0].title == "Lilu (mythology)" and len({h.doc_id for h in hits}) == 5
    hybrid.close()


def test_build_streams_and_bounds_python_memory(tmp_path):
    n = 30_000

    def texts():  # a generator: the build never holds the corpus
        for i in range(n):
            yield f"passage number {i} about topic{i % 97} and subject{i % 13} with words{i % 1009}"

    tracemalloc.start()
    settings = write_fts5(tmp_path, texts(), chunk=2_000)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert settings["n_passages"] == n and settings["engine"] == "fts5"
    assert peak < 8 * 2**20, peak  # a few chunks of rows, not the corpus (about 3 MiB of text here)
    idx = FTS5BM25Index(tmp_path, n)
    [(scores, rows)] = idx.search(["topic5 subject5"], 5, np.arange(n))
    assert len(rows) == 5 and all((r % 97 == 5) and (r % 13 == 5) for r in rows.tolist())  # both words first
    assert scores.dtype == np.float32 and list(scores) == sorted(scores, reverse=True)
    # a word in at least half the passages cannot move a ranking (FTS5 clamps its IDF): left out
    assert idx.match_expression("passage number topic5") == '"topic5"'
    assert len(idx.search(["passage number"], 5, np.arange(n))[0][1]) == 0


def test_cjk_bigrams_are_found(tmp_path):
    texts = ["床前明月光 疑是地上霜", "举头望明月 低头思故乡", "Lyon is a city in France"]
    write_fts5(tmp_path, texts)
    idx = FTS5BM25Index(tmp_path, 3)
    [(_, rows)] = idx.search(["故乡"], 3, np.arange(3))
    assert rows.tolist() == [1]
    [(_, rows)] = idx.search(["lyon_city Lyon"], 3, np.arange(3))
    assert rows.tolist() == [2]


def test_a_damaged_or_mismatched_file_is_named(tmp_path):
    write_fts5(tmp_path, ["a b c", "d e f"])
    with pytest.raises(CorruptIndexError, match=r"holds 2 passages, the manifest says 3"):
        FTS5BM25Index(tmp_path, 3)
    with pytest.raises(CorruptIndexError, match=r"tokenizer 'drgym-cjk-bigram-1', the manifest says 'bm25s'"):
        FTS5BM25Index(tmp_path, 2, "bm25s")
    (tmp_path / FTS5_FILE).write_bytes(b"not a database" * 100)
    with pytest.raises(CorruptIndexError, match=FTS5_FILE):
        FTS5BM25Index(tmp_path, 2)
    (tmp_path / FTS5_FILE).unlink()
    with pytest.raises(CorruptIndexError, match=FTS5_FILE):
        FTS5BM25Index(tmp_path, 2)
    with pytest.raises(ConfigError, match="chunk must be >= 1"):
        write_fts5(tmp_path, ["x"], chunk=0)


def test_cli_builds_an_fts5_index_and_refuses_an_unknown_engine(tmp_path, session_drgym_home):
    from drgym.cli import app

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"T{i}"\nword{i} shared text'}) + "\n"
                              for i in range(20)))
    res = CliRunner().invoke(app, ["index", "build", str(corpus), "--root", str(tmp_path / "idx"),
                                   "--bm25-engine", "fts5", "--no-resume"])
    assert res.exit_code == 0, res.output
    [folder] = [p for p in (tmp_path / "idx").iterdir() if p.name.endswith("--fts5")]
    m = json.loads((folder / "manifest.json").read_text())
    assert m["bm25"]["engine"] == "fts5" and FTS5_FILE in m["files"]
    listed = CliRunner().invoke(app, ["index", "list", "--root", str(tmp_path / "idx")])
    assert listed.exit_code == 0 and f"{folder.name}\t20 passages\tFlat\tBM25 fts5\t" in listed.output
    con = sqlite3.connect(folder / FTS5_FILE)
    assert dict(con.execute("SELECT key, value FROM meta"))["n_passages"] == "20"
    con.close()
    res = CliRunner().invoke(app, ["index", "build", str(corpus), "--root", str(tmp_path / "idx"),
                                   "--bm25-engine", "lucene"])
    assert res.exit_code != 0 and "bm25 engine" in res.output and "fts5" in res.output
