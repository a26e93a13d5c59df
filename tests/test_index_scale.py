"""Large-corpus index machinery on real data: ``drgym index import`` (a Search-R1 style
FAISS index or .npy shards) against a native build, the streamed and resumable build (a
build killed with SIGKILL, then resumed, against an uninterrupted one), concurrent
builders of one index, streamed BM25."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from drgym.docstore import DocStore
from drgym.errors import ConfigError, CorpusError, IndexNotFoundError
from drgym.index.build import BUILD_PREFIX, IndexSpec, build_index, choose_factory, get_encoder
from drgym.index.importer import import_index
from drgym.index.manifest import IndexManifest
from drgym.paths import DATA_DIR
from drgym.search.local import LocalSearchEngine

WIKI18 = DATA_DIR / "corpora" / "flashrag_wiki18_sample.jsonl"  # FlashRAG's 1,000 wiki-18 passages
# Real questions about passages of that sample, plus passage openings.
QUESTIONS = ["Who was Evan Morris?", "Which company did the lobbyist for Roche work for?",
             "Which publisher reprinted Cat Claw?", "Who founded Eternity Comics?"]


@pytest.fixture(scope="module")
def encoder():
    return get_encoder("all-MiniLM-L6-v2", "cpu")


def wiki18_queries(n: int = 30) -> list[str]:
    rows = [json.loads(line) for line in WIKI18.read_text().splitlines()]
    return QUESTIONS + [r["contents"].split("\n", 1)[1].split(". ")[0] for r in rows[::33][:n]]


def rankings(engine, queries, k=10):
    return [[(r.doc_id, r.score) for r in hits] for hits in engine.search_batch(queries, k)]


# -- import ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def native_and_export(tmp_path_factory, encoder):
    """A native build of the wiki-18 sample (one passage a row), and the same corpus
    exported in Search-R1's layout: ``wiki-18.jsonl`` + ``e5_Flat.index`` (a FAISS Flat
    inner-product index over the native vectors, built as Search-R1's index_builder
    does), plus the vectors as two .npy shards (float32 and float16)."""
    import faiss

    root = tmp_path_factory.mktemp("idx")
    nat = build_index(IndexSpec(corpus=str(WIKI18), factory="Flat", max_tokens=0), root=root, encoder=encoder)
    assert nat.manifest.n_passages == nat.manifest.n_documents == 1000
    emb = np.load(nat.folder / nat.manifest.shards[0].embeddings).astype(np.float32)
    ex = tmp_path_factory.mktemp("searchr1")
    shutil.copy(WIKI18, ex / "wiki-18.jsonl")
    index = faiss.index_factory(emb.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(emb)
    faiss.write_index(index, str(ex / "e5_Flat.index"))
    np.save(ex / "emb-0.npy", emb[:600])
    np.save(ex / "emb-1.npy", emb[600:].astype(np.float16))
    return root, nat, ex


def test_import_faiss_index_ranks_as_native_build(native_and_export, encoder):
    root, nat, ex = native_and_export
    # both keep the file's ids ("0".."999") and make up no URL, so the rankings compare equal
    imp = import_index(ex / "wiki-18.jsonl", faiss_index=ex / "e5_Flat.index", encoder="all-MiniLM-L6-v2",
                       root=root, name="searchr1-import")
    m = imp.manifest
    assert imp.built and (m.n_documents, m.n_passages, m.factory, m.dim) == (1000, 1000, "Flat", 384)
    assert m.encoder_revision == encoder.revision and m.normalized
    assert m.corpus_fingerprint == nat.manifest.corpus_fingerprint
    assert [s["role"] for s in m.sources] == ["corpus", "faiss"] and m.shards[0].embeddings == ""
    assert (imp.folder / "dense" / "faiss-00000.index").stat().st_ino == (ex / "e5_Flat.index").stat().st_ino  # hard link
    a = LocalSearchEngine(nat.folder, method="dense", encoder=encoder)
    b = LocalSearchEngine(imp.folder, method="dense", encoder=encoder)
    qs = wiki18_queries()
    for method in ("dense", "bm25", "hybrid"):
        assert rankings(a.with_method(method), qs) == rankings(b.with_method(method), qs), method
    top = b.search(QUESTIONS[0], 1)[0]
    assert top.title == "Evan Morris" and b.fetch(top.url).text.startswith("Evan Morris Evan L. Morris")
    # no embedding file: its scores come from the Flat index's own float32 rows, re-scored as a native shard's
    from drgym.index.dense import DenseIndex

    for mmap in (False, True):
        d = DenseIndex(imp.folder, m.shards, m.dim, m.n_passages, device="cpu", mmap=mmap)
        assert d._rescores(0) and d._exact[0].shape == (1000, 384) and d._exact[0].dtype == np.float32
        np.testing.assert_array_equal(d._exact[0][:3], d._indexes[0].reconstruct_n(0, 3))
    again = import_index(ex / "wiki-18.jsonl", faiss_index=ex / "e5_Flat.index", encoder="all-MiniLM-L6-v2",
                         root=root, name="searchr1-import")
    assert not again.built


def test_import_npy_shards_rank_as_native_build(native_and_export, encoder):
    root, nat, ex = native_and_export
    imp = import_index(ex / "wiki-18.jsonl", embeddings=[ex / "emb-0.npy", ex / "emb-1.npy"],
                       encoder="all-MiniLM-L6-v2", root=root, name="npy-import", shard_size=400, bm25=False)
    assert [(s.start, s.count) for s in imp.manifest.shards] == [(0, 400), (400, 400), (800, 200)]
    assert imp.manifest.factory == "Flat"  # auto, for 1,000 rows
    a = LocalSearchEngine(nat.folder, method="dense", encoder=encoder)
    b = LocalSearchEngine(imp.folder, method="dense", encoder=encoder)
    qs = wiki18_queries()
    assert rankings(a, qs) == rankings(b, qs)


def test_import_refuses_mismatched_inputs(native_and_export, tmp_path):
    import faiss

    root, nat, ex = native_and_export
    short = tmp_path / "short.jsonl"
    short.write_text("".join(WIKI18.read_text().splitlines(keepends=True)[:999]))
    with pytest.raises(CorpusError, match="has 999 rows, the vectors 1,000"):
        import_index(short, faiss_index=ex / "e5_Flat.index", encoder="all-MiniLM-L6-v2", root=tmp_path)
    np.save(tmp_path / "narrow.npy", np.zeros((1000, 383), np.float32))
    with pytest.raises(ConfigError, match="gives 384-d vectors, the imported vectors are 383-d"):
        import_index(ex / "wiki-18.jsonl", embeddings=[tmp_path / "narrow.npy"], encoder="all-MiniLM-L6-v2",
                     root=tmp_path)
    l2 = faiss.IndexFlatL2(384)
    l2.add(np.zeros((1000, 384), np.float32))
    faiss.write_index(l2, str(tmp_path / "l2.index"))
    with pytest.raises(ConfigError, match="METRIC_INNER_PRODUCT"):
        import_index(ex / "wiki-18.jsonl", faiss_index=tmp_path / "l2.index", encoder="all-MiniLM-L6-v2",
                     root=tmp_path)
    with pytest.raises(ConfigError, match="exactly one"):
        import_index(ex / "wiki-18.jsonl", encoder="all-MiniLM-L6-v2", root=tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(BUILD_PREFIX)]


def test_import_cli_with_an_encoder_that_is_not_installed(native_and_export, tmp_path):
    """A Search-R1 user's one command; the encoder (e5) is not on this machine, so the
    manifest names it with revision 'unknown' and the import still succeeds."""
    from typer.testing import CliRunner

    from drgym.cli import app

    _, _, ex = native_and_export
    res = CliRunner().invoke(app, ["index", "import", str(ex / "wiki-18.jsonl"), "--faiss", str(ex / "e5_Flat.index"),
                                   "--encoder", "intfloat/e5-base-v2", "--root", str(tmp_path), "--no-bm25"])
    assert res.exit_code == 0, res.output
    assert "built: 1000 documents, 1000 passages, 1 shard(s), factory Flat, encoder intfloat/e5-base-v2@unknown" in res.output
    m = IndexManifest.read(tmp_path / "wiki-18--e5-base-v2--Flat")
    assert m.dim == 384 and m.chunking["imported"] == "faiss"


# -- streamed build: units, resume after SIGKILL ---------------------------------------------


def test_units_of_a_jsonl_file_read_as_the_whole_file():
    from drgym.corpus.readers import read_corpus
    from drgym.index.units import plan_units

    units, sources, label = plan_units(str(WIKI18), chunk_docs=300)
    assert [u.n_docs for u in units] == [300, 300, 300, 100] and label == str(WIKI18.resolve())
    assert sources[0]["bytes"] == WIKI18.stat().st_size
    whole = list(read_corpus(WIKI18))
    assert [d for u in units for d in u.read()] == whole


def test_units_of_a_gzip_jsonl_file_are_spans_read_with_one_decompression(tmp_path, monkeypatch):
    """Search-R1 ships wiki-18 as ``wiki-18.jsonl.gz``: its units are spans of the
    decompressed bytes, read in order by one gzip stream, not the whole file in memory."""
    import gzip

    from drgym.corpus import readers
    from drgym.corpus.readers import read_corpus
    from drgym.index.units import plan_units

    gz = tmp_path / "wiki-18.jsonl.gz"
    gz.write_bytes(gzip.compress(WIKI18.read_bytes()))
    units, _, _ = plan_units(str(gz), chunk_docs=300)
    plain, _, _ = plan_units(str(WIKI18), chunk_docs=300)
    assert [u.kind for u in units] == ["span"] * 4 and [u.span for u in units] == [u.span for u in plain]
    opened = []
    real_open = gzip.open
    monkeypatch.setattr(readers.gzip, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    whole = list(read_corpus(WIKI18))
    assert [d for u in units for d in u.read()] == whole
    assert len(opened) == 1  # each span went on where the last one stopped
    assert units[1].read() == whole[300:600] and len(opened) == 2  # out of order: decompressed from the start
    assert [d for u in units[2:] for d in u.read()] == whole[600:] and len(opened) == 2


def test_units_of_a_folder_of_jsonl_and_parquet_shards(tmp_path):
    """A corpus folder of two shards (JSONL, and parquet in 3 row groups) in wiki-18
    layout: units cut the parquet file by row group, and the units read back the 1,000
    passages in order, as the wiki-18 reader reads the original file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from drgym.corpus.readers import read_corpus
    from drgym.index.units import plan_units

    lines = WIKI18.read_text().splitlines(keepends=True)
    folder = tmp_path / "wiki18-shards"
    folder.mkdir()
    (folder / "part-0.jsonl").write_text("".join(lines[:400]))
    rows = [json.loads(x) for x in lines[400:]]
    pq.write_table(pa.Table.from_pylist(rows), folder / "part-1.parquet", row_group_size=250)
    (folder / "README.txt").write_text("not a corpus file")
    units, sources, _ = plan_units(str(folder), chunk_docs=300)
    assert [(Path(u.path).name, u.n_docs) for u in units] == [
        ("part-0.jsonl", 300), ("part-0.jsonl", 100), ("part-1.parquet", 500), ("part-1.parquet", 100)]
    assert [Path(s["path"]).name for s in sources] == ["part-0.jsonl", "part-1.parquet"]
    docs = [d for u in units for d in u.read()]
    whole = list(read_corpus(WIKI18))
    assert [(d.doc_id, d.title, d.text) for d in docs] == [(d.doc_id, d.title, d.text) for d in whole]


def untitled_corpus(path: Path, n: int) -> Path:
    """``n`` real 2WikiMultihopQA paragraphs as FineWeb-style rows without titles: not in
    the shipped embedding cache, so every passage is encoded live."""
    rows = json.loads((DATA_DIR / "corpora" / "2wikimultihopqa_corpus.json").read_text())[:n]
    with open(path, "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"id": f"2w{i:04d}", "url": f"https://example.org/{i}", "text": r["text"]}) + "\n")
    return path


def _units_done(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.1) as c:
            return int(c.execute("SELECT count(*) FROM drgym_build_units").fetchone()[0])
    except sqlite3.Error:
        return 0


def test_killed_build_leaves_nothing_loadable_and_resumes_to_the_same_index(tmp_path, encoder):
    corpus = untitled_corpus(tmp_path / "untitled.jsonl", 120)
    name = "untitled"
    args = ["--corpus", str(corpus), "--chunk-docs", "20", "--factory", "Flat", "--name", name]
    killed_root, clean_root = tmp_path / "killed", tmp_path / "clean"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "DRGYM_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "drgym", "index", "build", *args, "--root", str(killed_root)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    db = killed_root / f"{BUILD_PREFIX}{name}" / "docs.sqlite"
    deadline = time.monotonic() + 240
    while _units_done(db) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"the build ended before it could be killed: {proc.stdout.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = _units_done(db)
    assert 2 <= done <= 6  # killed after 2 of 6 units or later (how much later depends on the machine, not drgym)
    # Nothing a loader takes for an index: no folder, the partial build is hidden and listed as such.
    assert not (killed_root / name).exists()
    with pytest.raises(IndexNotFoundError):
        LocalSearchEngine(killed_root / name)
    from typer.testing import CliRunner

    from drgym.cli import app

    env_home = os.environ.get("DRGYM_HOME")
    os.environ["DRGYM_HOME"] = str(tmp_path / "listhome")
    try:
        (tmp_path / "listhome" / "indexes").mkdir(parents=True)
        shutil.copytree(killed_root / f"{BUILD_PREFIX}{name}", tmp_path / "listhome" / "indexes" / f"{BUILD_PREFIX}{name}")
        listing = CliRunner().invoke(app, ["index", "list"])
        assert f"{name}\tpartial build" in listing.output
    finally:
        if env_home is None:
            os.environ.pop("DRGYM_HOME", None)
        else:
            os.environ["DRGYM_HOME"] = env_home

    spec = IndexSpec(corpus=str(corpus), factory="Flat", name=name, chunk_docs=20)
    resumed = build_index(spec, root=killed_root, encoder=encoder)
    assert resumed.built and resumed.resumed_units == done
    assert resumed.manifest.timings["passages_encoded_live"] < resumed.manifest.n_passages
    clean = build_index(spec, root=clean_root, encoder=encoder)
    assert clean.resumed_units == 0 and clean.manifest.timings["passages_encoded_live"] == clean.manifest.n_passages
    assert_same_index(resumed.folder, clean.folder)
    assert not (killed_root / f"{BUILD_PREFIX}{name}").exists()


def assert_same_index(a: Path, b: Path) -> None:
    """Two index folders hold the same index: manifest identity and counts, docstore rows,
    float16 embeddings and tie ranks bit for bit, FAISS and BM25 files byte for byte."""
    ma, mb = IndexManifest.read(a), IndexManifest.read(b)
    assert ma.identity() | {"sources": None} == mb.identity() | {"sources": None}
    assert (ma.n_documents, ma.n_passages, ma.shards) == (mb.n_documents, mb.n_passages, mb.shards)
    assert set(ma.files) == set(mb.files)
    for rel in ma.files:
        if rel.endswith(".npy") or rel.startswith("dense/faiss") or rel.startswith("bm25/"):
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    da, db = DocStore(a / "docs.sqlite"), DocStore(b / "docs.sqlite")
    rows = list(range(ma.n_passages))
    assert da.passages(rows) == db.passages(rows)
    q = "SELECT doc_id, url, norm_url, title, text, source, metadata FROM documents ORDER BY rowid"
    assert da._query(q) == db._query(q)


# -- concurrent builders (issue 2.1) ---------------------------------------------------------


def test_two_processes_building_the_default_index_at_once(tmp_path):
    """Two ``drgym index build`` runs on an empty DRGYM_HOME at the same moment: one builds,
    the other waits on the lock and reuses its index; both report the same manifest."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "DRGYM_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "drgym", "index", "build"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    built = [o for o in outs if "\nbuilt: 20036 documents" in o]
    reused = [o for o in outs if "up to date (not rebuilt)" in o]
    assert len(built) == 1 and len(reused) == 1, outs
    folder = tmp_path / "home" / "indexes" / "wiki-default--all-MiniLM-L6-v2--Flat"
    assert f"index: {folder}" in outs[0] and f"index: {folder}" in outs[1]
    indexes = sorted(p.name for p in (tmp_path / "home" / "indexes").iterdir() if not p.name.endswith(".lock"))
    assert indexes == [".plans", "wiki-default--all-MiniLM-L6-v2--Flat"] or indexes == ["wiki-default--all-MiniLM-L6-v2--Flat"]
    LocalSearchEngine(folder, method="bm25").search("Hamlet", 1)


# -- BM25 streamed ---------------------------------------------------------------------------


def test_streamed_bm25_equals_one_bm25s_call(tmp_path):
    import bm25s

    from drgym.corpus import load_named_corpus
    from bm25s.tokenization import Tokenized

    from drgym.index.bm25 import BM25Index, tokenize, write_bm25

    texts = [f"{d.title}\n{d.text}" for d in load_named_corpus("hipporag")]
    settings = write_bm25(tmp_path / "a", iter(texts), chunk=500)
    r = bm25s.BM25()
    vocab: dict[str, int] = {}  # drgym's tokens (CJK bigrams), ids in first-seen order as bm25s.tokenize's
    ids = [[vocab.setdefault(t, len(vocab)) for t in tokenize(x)] for x in texts]
    r.index(Tokenized(ids=ids, vocab=vocab), show_progress=False)
    r.save(str(tmp_path / "b" / "bm25"))
    a, b = BM25Index(tmp_path / "a", len(texts)), BM25Index(tmp_path / "b", len(texts))
    assert a.retriever.vocab_dict == b.retriever.vocab_dict and settings["vocab_size"] == len(b.retriever.vocab_dict)
    for q in ("If Gallu is a demon Lilu is what?", "river delta", "xyzzy"):
        assert np.array_equal(a.scores(q), b.scores(q))
    # too large for memory: built streaming, with the same vocabulary and the same scores to the bit
    import tracemalloc

    tracemalloc.start()
    streamed = write_bm25(tmp_path / "c", iter(texts), max_memory=10_000_000, chunk=500)
    _, peak_streamed = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    write_bm25(tmp_path / "d", iter(texts), chunk=500, streaming=False)
    _, peak_in_memory = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert streamed["built"] == "streaming" and settings["built"] == "in memory"
    assert {k: v for k, v in streamed.items() if k != "built"} == {k: v for k, v in settings.items() if k != "built"}
    c = BM25Index(tmp_path / "c", len(texts))
    assert c.retriever.vocab_dict == b.retriever.vocab_dict
    for q in ("If Gallu is a demon Lilu is what?", "river delta", "xyzzy", "the of and"):
        assert np.array_equal(c.scores(q), b.scores(q))
    assert c.search(["river delta"], 10, np.arange(len(texts)))[0][1].tolist() == \
        a.search(["river delta"], 10, np.arange(len(texts)))[0][1].tolist()
    assert peak_streamed < peak_in_memory, (peak_streamed, peak_in_memory)


def test_auto_factory_by_size():
    assert choose_factory(20_036, 384) == "Flat"
    assert choose_factory(1_000_000, 384) == "Flat"
    assert choose_factory(1_000_001, 384) == "IVF1024,PQ48x4fs"
    assert choose_factory(5_000_000, 384) == "IVF2048,PQ48x4fs"
    assert choose_factory(87_000_000, 768, shard_size=25_000_000) == "IVF4096,PQ96x4fs"
    assert choose_factory(21_015_324, 384, shard_size=2_500_000) == "IVF2048,PQ48x4fs"
    assert choose_factory(87_000_000, 770) == "IVF8192,PQ77x4fs"
