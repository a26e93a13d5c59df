"""Index building blocks on the real ``hotpotqa`` corpus (994 HotpotQA paragraphs, whose
vectors come from the shipped embedding cache): docstore, manifest, shards, FAISS
factories, BM25, RRF, rebuild rules, mismatched and corrupt indexes."""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pytest

from drgym.corpus import load_named_corpus
from drgym.docstore import DocStore
from drgym.errors import (
    BadQueryError,
    ConfigError,
    CorruptIndexError,
    DocumentNotFoundError,
    IndexMismatchError,
    IndexNotFoundError,
)
from drgym.index.bm25 import rrf_fuse
from drgym.index.build import IndexSpec, build_index, get_encoder
from drgym.index.manifest import IndexManifest, manifest_digest
from drgym.search.local import LocalSearchEngine

GALLU = "If Gallu is a demon Lilu is what?"  # HotpotQA train; supporting: "Alû", "Lilu (mythology)"


@pytest.fixture(scope="module")
def encoder():
    return get_encoder("all-MiniLM-L6-v2", "cpu")


@pytest.fixture(scope="module")
def hotpot_docs():
    return load_named_corpus("hotpotqa")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("indexes")


@pytest.fixture(scope="module")
def flat(root, encoder, hotpot_docs):
    res = build_index(IndexSpec(corpus="hotpotqa"), root=root, encoder=encoder, docs=hotpot_docs)
    assert res.built
    return res


@pytest.fixture(scope="module")
def sharded(root, encoder, hotpot_docs):
    return build_index(IndexSpec(corpus="hotpotqa", shard_size=300), root=root, encoder=encoder, docs=hotpot_docs)


def queries(docs, n=40):
    """Real queries: the first sentence of every 25th paragraph, plus a HotpotQA question."""
    return [GALLU] + [d.text.split(". ")[0] for d in docs[::25][:n]]


# -- build, manifest ------------------------------------------------------------------------


def test_build_uses_cache_and_writes_manifest(flat, encoder):
    m = flat.manifest
    assert m.n_documents == 994 and m.n_passages >= 994
    assert m.timings["passages_encoded_live"] == 0  # all vectors from the shipped cache
    assert (m.encoder, m.dim, m.metric, m.normalized, m.factory) == ("all-MiniLM-L6-v2", 384, "inner_product", True, "Flat")
    assert m.encoder_revision == encoder.revision
    assert m.chunking == {"max_tokens": 224, "overlap": 32, "tokenizer": "all-MiniLM-L6-v2", "encoder_max_length": 256}
    assert len(m.shards) == 1 and m.shards[0].count == m.n_passages
    assert set(m.files) >= {"docs.sqlite", "dense/emb-00000.npy", "dense/faiss-00000.index", "dense/tie_rank.npy"}
    on_disk = json.loads((flat.folder / "manifest.json").read_text())
    assert on_disk["corpus_fingerprint"] == m.corpus_fingerprint and on_disk["drgym_version"]
    emb = np.load(flat.folder / m.shards[0].embeddings, mmap_mode="r")
    assert emb.dtype == np.float16 and emb.shape == (m.n_passages, 384)
    norms = np.linalg.norm(np.asarray(emb[:200], np.float32), axis=1)
    assert np.abs(norms - 1).max() < 2e-3
    assert not [p for p in flat.folder.parent.iterdir() if p.name.startswith(".tmp-")]


def test_unchanged_manifest_means_no_rebuild(flat, root, encoder, hotpot_docs):
    before = (flat.folder / "manifest.json").stat().st_mtime_ns
    again = build_index(IndexSpec(corpus="hotpotqa"), root=root, encoder=encoder, docs=hotpot_docs)
    assert not again.built and again.folder == flat.folder
    assert (flat.folder / "manifest.json").stat().st_mtime_ns == before
    # A changed chunking parameter changes the identity: same folder name, rebuilt.
    other = build_index(IndexSpec(corpus="hotpotqa", name="hp-rebuild"), root=root, encoder=encoder, docs=hotpot_docs[:50])
    assert other.built
    changed = build_index(IndexSpec(corpus="hotpotqa", name="hp-rebuild", overlap=16), root=root, encoder=encoder,
                          docs=hotpot_docs[:50])
    assert changed.built and changed.manifest.chunking["overlap"] == 16
    assert IndexManifest.read(root / "hp-rebuild").chunking["overlap"] == 16


def test_bad_factory_is_config_error_and_leaves_nothing(root, encoder, hotpot_docs):
    with pytest.raises(ConfigError, match="Invalid FAISS factory string 'NoSuchIndex7'"):
        build_index(IndexSpec(corpus="hotpotqa", factory="NoSuchIndex7", bm25=False), root=root, encoder=encoder,
                    docs=hotpot_docs[:20])
    assert not (root / "hotpotqa--all-MiniLM-L6-v2--NoSuchIndex7").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]


# -- docstore --------------------------------------------------------------------------------


def test_docstore_lookups(flat, hotpot_docs):
    ds = DocStore(flat.folder / "docs.sqlite")
    assert len(ds) == 994
    lilu = next(d for d in hotpot_docs if d.title == "Lilu (mythology)")
    assert ds.get(lilu.doc_id) == lilu
    assert ds.fetch("https://en.wikipedia.org/wiki/Lilu_(mythology)") == lilu
    # normalised: http, mobile host, percent-encoded space, trailing slash
    assert ds.fetch("http://en.m.wikipedia.org/wiki/Lilu%20(mythology)/") == lilu
    # unknown fragment falls back to the page URL
    assert ds.fetch("https://en.wikipedia.org/wiki/Lilu_(mythology)#History") == lilu
    alu = next(d for d in hotpot_docs if d.title == "Alû")
    assert ds.fetch("https://en.wikipedia.org/wiki/Al%C3%BB") == alu
    with pytest.raises(DocumentNotFoundError, match="URL not found"):
        ds.fetch("https://en.wikipedia.org/wiki/No_such_page_xyz")
    with pytest.raises(DocumentNotFoundError):
        ds.get("hotpotqa-99999")
    recs = ds.passages([0, 1, 5])
    assert sorted(recs) == [0, 1, 5] and recs[0].passage_id.startswith("hotpotqa-")
    ds.close()


def test_docstore_is_thread_safe(flat, hotpot_docs):
    ds = DocStore(flat.folder / "docs.sqlite")
    errors, seen = [], []

    def work(offset):
        try:
            for d in hotpot_docs[offset::8][:60]:
                seen.append(ds.fetch(d.url).doc_id == d.doc_id and ds.get(d.doc_id) == d)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ds.close()
    assert not errors and len(seen) == 480 and all(seen)


# -- dense shards, factories ------------------------------------------------------------------


def test_shards_merge_equals_single_shard(flat, sharded, encoder, hotpot_docs):
    assert len(sharded.manifest.shards) == -(-sharded.manifest.n_passages // 300) >= 4
    one = LocalSearchEngine(flat.folder, method="dense", encoder=encoder)
    many = LocalSearchEngine(sharded.folder, method="dense", encoder=encoder)
    qs = queries(hotpot_docs)
    a, b = one.search_batch(qs, 10), many.search_batch(qs, 10)
    assert [[r.doc_id for r in x] for x in a] == [[r.doc_id for r in x] for x in b]
    # BLAS sums a shard's inner products in another order than the whole file's on some
    # OpenBLAS kernels: equal rankings, scores equal to float32 rounding
    import numpy as np

    np.testing.assert_allclose([[r.score for r in x] for x in a], [[r.score for r in x] for x in b], rtol=0, atol=1e-6)
    assert a[0][0].title in ("Lilu (mythology)", "Alû")


def test_hnsw_recall_against_flat(root, flat, encoder, hotpot_docs):
    hnsw = build_index(IndexSpec(corpus="hotpotqa", factory="HNSW32", bm25=False), root=root, encoder=encoder, docs=hotpot_docs)
    exact = LocalSearchEngine(flat.folder, method="dense", encoder=encoder)
    ann = LocalSearchEngine(hnsw.folder, method="dense", encoder=encoder)
    qs = queries(hotpot_docs)
    ra = exact.search_rows(qs, 10)
    rb = ann.search_rows(qs, 10)
    recall = np.mean([len(set(a[1]) & set(b[1])) / 10 for a, b in zip(ra, rb)])
    assert recall >= 0.98


def test_ivfpq_trains_and_searches(root, flat, encoder, hotpot_docs):
    ivf = build_index(IndexSpec(corpus="hotpotqa", factory="IVF16,PQ32x4", bm25=False), root=root, encoder=encoder,
                      docs=hotpot_docs)
    exact = LocalSearchEngine(flat.folder, method="dense", encoder=encoder)
    ann = LocalSearchEngine(ivf.folder, method="dense", encoder=encoder)
    qs = queries(hotpot_docs)
    ra, rb = exact.search_rows(qs, 10), ann.search_rows(qs, 10)
    assert all(len(r[1]) == 10 for r in rb)
    # PQ32x4 keeps 16 bytes of 768: coarse, yet the exact top-1 is mostly in its top-10
    top1 = np.mean([a[1][0] in set(b[1]) for a, b in zip(ra, rb)])
    print("IVF16,PQ32x4 exact top-1 in top-10:", top1)
    assert top1 >= 0.8


def test_ivf_with_too_few_vectors_is_config_error(root, encoder, hotpot_docs):
    with pytest.raises(ConfigError, match="IVF4096"):
        build_index(IndexSpec(corpus="hotpotqa", factory="IVF4096,Flat", bm25=False, name="ivf-too-big"), root=root,
                    encoder=encoder, docs=hotpot_docs[:100])


# -- BM25 and RRF ------------------------------------------------------------------------------


def test_bm25_and_hybrid(flat, encoder):
    bm = LocalSearchEngine(flat.folder, method="bm25", encoder=encoder)
    top = bm.search(GALLU, 5)
    assert {"Alû", "Lilu (mythology)"} <= {r.title for r in top[:3]}
    assert all(top[i].score >= top[i + 1].score for i in range(len(top) - 1))
    # stopwords only / unknown words: no passage shares a word, so nothing is returned
    assert bm.search("the of and to", 5) == []
    assert bm.search("zzqxv wvvkq", 5) == []
    hy = bm.with_method("hybrid")
    h = hy.search(GALLU, 5)
    assert h[0].title in ("Lilu (mythology)", "Alû") and h[0].metadata["method"] == "hybrid"
    assert h[0].score == pytest.approx(1 / 61 + 1 / 62, abs=1e-6) or h[0].score == pytest.approx(2 / 61, abs=1e-6)


def test_rrf_by_hand():
    tie_rank = np.arange(10, dtype=np.int64)
    scores, rows = rrf_fuse([np.array([1, 2, 3]), np.array([3, 1])], 10, tie_rank)
    assert rows.tolist() == [1, 3, 2]
    assert scores.tolist() == pytest.approx([1 / 61 + 1 / 62, 1 / 63 + 1 / 61, 1 / 62])
    # equal fused scores: ties go to the smaller passage_id rank
    _, rows = rrf_fuse([np.array([7, 4]), np.array([4, 7])], 10, tie_rank)
    assert rows.tolist() == [4, 7]


# -- loading errors ----------------------------------------------------------------------------


def test_mismatched_encoder_is_refused(flat, root):
    with pytest.raises(IndexMismatchError, match="built with encoder 'all-MiniLM-L6-v2', but encoder 'intfloat/e5-small-v2'"):
        LocalSearchEngine(flat.folder, encoder="intfloat/e5-small-v2")
    # Same name, other weights: the revision is checked too.
    copy = root / "hp-revision"
    shutil.copytree(flat.folder, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["encoder_revision"] = "0123456789abcdef"
    m["checksums"]["manifest"] = manifest_digest(m)  # as a build with those weights writes it
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IndexMismatchError, match="revision '0123456789abcdef'"):
        LocalSearchEngine(copy, encoder="all-MiniLM-L6-v2")


def test_corrupt_index_is_reported(flat, root):
    with pytest.raises(IndexNotFoundError):
        LocalSearchEngine(root / "no-such-index")
    # truncated FAISS file
    c1 = root / "hp-trunc"
    shutil.copytree(flat.folder, c1)
    f = c1 / "dense" / "faiss-00000.index"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(CorruptIndexError, match=r"faiss-00000.index has 1000 bytes, the manifest says \d+"):
        LocalSearchEngine(c1)
    # truncated file whose manifest was edited to match: FAISS itself cannot read it
    m = json.loads((c1 / "manifest.json").read_text())
    m["files"]["dense/faiss-00000.index"] = 1000
    m["checksums"]["manifest"] = manifest_digest(m)  # the manifest's own hash edited to match too
    (c1 / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CorruptIndexError, match="unreadable"):
        LocalSearchEngine(c1, method="dense").search("demon", 3)
    # garbage manifest
    c2 = root / "hp-badjson"
    shutil.copytree(flat.folder, c2)
    (c2 / "manifest.json").write_text('{"name": "x", ')
    with pytest.raises(CorruptIndexError, match="not valid JSON"):
        LocalSearchEngine(c2)
    # truncated SQLite docstore
    c3 = root / "hp-sqlite"
    shutil.copytree(flat.folder, c3)
    db = c3 / "docs.sqlite"
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    with pytest.raises(CorruptIndexError, match="docs.sqlite"):
        LocalSearchEngine(c3)


def test_build_repairs_a_corrupt_index(root, encoder, hotpot_docs):
    spec = IndexSpec(corpus="hotpotqa", name="hp-repair", bm25=False)
    res = build_index(spec, root=root, encoder=encoder, docs=hotpot_docs[:30])
    f = res.folder / "dense" / "emb-00000.npy"
    f.write_bytes(f.read_bytes()[:500])
    again = build_index(spec, root=root, encoder=encoder, docs=hotpot_docs[:30])
    assert again.built
    LocalSearchEngine(again.folder, method="dense", encoder=encoder).search("demon", 3)


def test_bad_requests(flat, encoder):
    e = LocalSearchEngine(flat.folder, method="bm25")
    for bad_k in (0, -1, 10**6, True, 2.5):
        with pytest.raises(BadQueryError, match="k must"):
            e.search("demon", bad_k)
    for bad_q in ("", "   \n\t"):
        with pytest.raises(BadQueryError, match="empty"):
            e.search(bad_q, 3)
    with pytest.raises(ConfigError, match="Unknown search method"):
        LocalSearchEngine(flat.folder, method="semantic")


def test_cli_index_build_on_a_corpus_file(tmp_path, encoder):
    """``drgym index build`` on a FineWeb-style file (format sniffed; the 4 untitled rows are
    not in the shipped cache, so they are encoded live; one is split in two)."""
    from typer.testing import CliRunner

    from drgym.cli import app

    from conftest import DATA

    args = ["index", "build", "--corpus", str(DATA / "corpus" / "web_rows.jsonl"), "--root", str(tmp_path),
            "--factory", "HNSW32", "--shard-size", "3"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    folder = tmp_path / "web_rows--all-MiniLM-L6-v2--HNSW32--s3"
    assert f"index: {folder}" in res.output and "built: 4 documents, 5 passages, 2 shard(s)" in res.output
    m = IndexManifest.read(folder)
    # Etan Boritzer's 339-token paragraph is split into windows of 224 tokens (overlap 32).
    assert m.timings["passages_encoded_live"] == 5 and m.corpus.endswith("web_rows.jsonl")
    ds = DocStore(folder / "docs.sqlite")
    assert [ds.passages([3, 4])[r].passage_id for r in (3, 4)] == ["<urn:uuid:fw-0003>#p0", "<urn:uuid:fw-0003>#p1"]
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "up to date (not rebuilt)" in again.output
    e = LocalSearchEngine(folder)
    assert e.search("queen of Lotharingia", 1)[0].url == "https://en.wikipedia.org/wiki/Teutberga"
    assert e.with_method("dense").search("Who was the bishop of Elmham?", 1)[0].doc_id == "<urn:uuid:fw-0001>"
    bad = CliRunner().invoke(app, ["index", "build", "--corpus", "no-such-corpus", "--root", str(tmp_path)])
    assert bad.exit_code == 2 and "Unknown corpus" in bad.output
