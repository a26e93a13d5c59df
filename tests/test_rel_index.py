"""Index reliability: checksums in the manifest (same-size corruption is caught at load,
by ``drgym index verify`` and while searching), CJK bigram tokens for BM25, and searches
in a child forked after a multi-threaded search."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from typer.testing import CliRunner

from drgym.corpus import load_named_corpus
from drgym.errors import CorruptIndexError
from drgym.index.build import IndexSpec, build_index, get_encoder
from drgym.index.manifest import IndexManifest
from drgym.search.local import LocalSearchEngine
from drgym.types import Document

GALLU = "If Gallu is a demon Lilu is what?"


@pytest.fixture(scope="module")
def encoder():
    return get_encoder("all-MiniLM-L6-v2", "cpu")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A module-wide DRGYM_HOME in tmp (``drgym index verify NAME`` resolves names in it)."""
    from envs_helpers import drgym_home

    with drgym_home(tmp_path_factory.mktemp("drgym_home")) as home:
        yield home


@pytest.fixture(scope="module")
def hp(home, encoder):
    """The hotpotqa corpus (994 paragraphs, shipped vectors), Flat + BM25, in ``home``."""
    res = build_index(IndexSpec(corpus="hotpotqa", name="hp"), root=home / "indexes", encoder=encoder,
                      docs=load_named_corpus("hotpotqa"))
    assert res.built
    return res


def _copy(res, home, name):
    dst = home / "indexes" / name
    shutil.copytree(res.folder, dst)
    return dst


def _garble(path, offset, n=1 << 16, seed=0):
    """Overwrite ``n`` bytes at ``offset`` with random bytes (same size)."""
    data = bytearray(path.read_bytes())
    n = min(n, len(data) - offset)
    data[offset:offset + n] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


def _verify(name):
    from drgym.cli import app

    return CliRunner().invoke(app, ["index", "verify", name])


# -- checksums --------------------------------------------------------------------------------


def test_manifest_records_checksums_of_every_file(hp):
    m = IndexManifest.read(hp.folder)
    sums = m.checksums
    assert sums["algorithm"] == "blake2b-128" and sums["sample"]["block_bytes"] == 65536
    assert set(sums["files"]) == set(m.files) >= {"docs.sqlite", "dense/faiss-00000.index", "bm25/data.csc.index.npy"}
    import hashlib

    raw = (hp.folder / "dense" / "faiss-00000.index").read_bytes()
    assert sums["files"]["dense/faiss-00000.index"]["full"] == hashlib.blake2b(raw, digest_size=16).hexdigest()
    assert m.format_version == 3 and m.bm25["tokenizer"] == "drgym-cjk-bigram-1"
    res = _verify("hp")
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"ok: index hp at {hp.folder}: {len(m.files)} files")


def test_garbled_faiss_block_of_the_same_size_is_caught_at_load_and_by_verify(hp, home):
    """The tester's case: 64 KiB garbled inside the FAISS file used to load and change
    the rankings; now loading names the file, and ``drgym index verify`` lists it."""
    folder = _copy(hp, home, "hp-faiss")
    f = folder / "dense" / "faiss-00000.index"
    size = f.stat().st_size
    _garble(f, size // 2)
    assert f.stat().st_size == size
    with pytest.raises(CorruptIndexError) as err:
        LocalSearchEngine(folder, method="dense")
    msg = str(err.value)
    assert "\n" not in msg and str(f) in msg and "another content" in msg
    assert "drgym index build --force" in msg and "drgym index verify hp-faiss" in msg
    res = _verify("hp-faiss")
    assert res.exit_code == 1
    bad = [ln for ln in res.output.splitlines() if ln.startswith("bad: ")]
    assert len(bad) == 1 and bad[0].startswith(f"bad: {f} is unreadable: it has the recorded size but another "
                                               "content (full blake2b-128 hash ")
    n_files = len(IndexManifest.read(folder).files)
    assert f"1 of {n_files} files are bad" in res.output and "drgym index build --force" in res.output


def test_sampled_check_of_a_large_file_reads_fixed_blocks(tmp_path):
    from drgym.index.manifest import record_checksums, record_files

    d = tmp_path / "idx"
    d.mkdir()
    big = d / "big.bin"
    big.write_bytes(np.random.default_rng(1).integers(0, 256, (65 << 20) + 123, dtype=np.uint8).tobytes())
    files = record_files(d)
    m = IndexManifest("x", "c", "", 0, 0, "e", "r", 1, "inner_product", True, "Flat", {}, 1, [], None, "0",
                      files=files, checksums=record_checksums(d, files))
    assert m.file_problems(d, "full") == [] and m.file_problems(d, "sample") == []
    _garble(big, 0, 10)  # the first block is sampled: both checks see it
    assert [p[0] for p in m.file_problems(d, "sample")] == ["big.bin"]
    m.checksums = record_checksums(d, files)
    _garble(big, 30 << 20, 10, seed=2)  # between sampled blocks: only the full hash sees it
    assert m.file_problems(d, "sample") == []
    assert [p[0] for p in m.file_problems(d, "full")] == ["big.bin"]
    with pytest.raises(CorruptIndexError, match="big.bin is unreadable: it has the recorded size but another content"):
        m.check_files(d, "full")


def test_old_manifest_without_checksums_still_loads_and_says_so(hp, home, caplog):
    folder = _copy(hp, home, "hp-old")
    m = json.loads((folder / "manifest.json").read_text())
    del m["checksums"]
    m["format_version"] = 2  # as written before checksums existed (a format-3 manifest without them is corrupt)
    (folder / "manifest.json").write_text(json.dumps(m))
    with caplog.at_level("WARNING", logger="drgym.index.manifest"):
        e = LocalSearchEngine(folder, method="bm25")
        e2 = LocalSearchEngine(folder, method="bm25")
    assert e.search(GALLU, 3)[0].title in ("Alû", "Lilu (mythology)")
    notes = [r.getMessage() for r in caplog.records if "has no checksums" in r.getMessage()]
    assert len(notes) == 1 and "only file sizes are checked" in notes[0]
    e.close(), e2.close()
    res = _verify("hp-old")
    assert res.exit_code == 0 and "sizes only" in res.output and "record checksums" in res.output


def test_garbled_bm25_arrays_raise_corrupt_index_error_not_index_error(hp, home):
    """A garbled BM25 array used to raise a raw IndexError (a traceback in ``drgym
    search``); with the load-time checks off (``verify="size"``) the column checks still
    name the file."""
    from drgym.cli import app

    folder = _copy(hp, home, "hp-bm25")
    ip = folder / "bm25" / "indices.csc.index.npy"
    arr = np.load(ip)
    arr[:] = np.int32(10**9)  # every passage row far out of range (same size, same dtype)
    np.save(ip, arr)
    e = LocalSearchEngine(folder, method="bm25", verify="size")
    with pytest.raises(CorruptIndexError, match=r"indices.csc.index.npy is unreadable: the column of term \d+ holds "
                                                r"passage rows outside 0\.\.\d+; the index is corrupt"):
        e.search(GALLU, 3)
    e.close()
    # the default load check names it first; the CLI prints one line, no traceback
    res = CliRunner().invoke(app, ["search", GALLU, "--index", "hp-bm25", "--method", "bm25"])
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and "Traceback" not in res.output
    assert str(ip) in errors[0] and "drgym index verify hp-bm25" in errors[0]
    # a garbled column pointer
    pp = folder / "bm25" / "indptr.csc.index.npy"
    ptr = np.load(pp)
    np.save(ip, np.load(hp.folder / "bm25" / "indices.csc.index.npy"))
    ptr[1:-1] = ptr[-1] + 5
    np.save(pp, ptr)
    e = LocalSearchEngine(folder, method="bm25", verify="size")
    with pytest.raises(CorruptIndexError, match=r"indptr.csc.index.npy is unreadable: the column of term \d+ spans"):
        e.search(GALLU, 3)
    e.close()


def test_full_verify_option_and_flag(hp, home):
    """``verify=True`` / ``--verify`` hash every byte: a garbled block between the sampled
    ones of a file larger than 64 MiB is found (the sampled check cannot), here emulated by
    a manifest that records a sample of the garbled file."""
    from drgym.cli import app

    folder = _copy(hp, home, "hp-full")
    f = folder / "docs.sqlite"
    _garble(f, f.stat().st_size // 3, 4096)
    m = json.loads((folder / "manifest.json").read_text())
    from drgym.index.manifest import sample_hash

    m["checksums"]["files"]["docs.sqlite"]["sample"] = sample_hash(f)  # the sample misses the damage
    (folder / "manifest.json").write_text(json.dumps(m))
    LocalSearchEngine(folder, method="bm25").close()  # sampled check: passes
    with pytest.raises(CorruptIndexError, match="docs.sqlite is unreadable: .*full blake2b-128 hash"):
        LocalSearchEngine(folder, method="bm25", verify=True)
    res = CliRunner().invoke(app, ["search", GALLU, "--index", "hp-full", "--method", "bm25", "--verify"])
    assert res.exit_code == 2 and "docs.sqlite is unreadable" in res.output and "Traceback" not in res.output


def test_build_rebuilds_an_index_with_a_garbled_file(home, encoder):
    spec = IndexSpec(corpus="hotpotqa", name="hp-repair", bm25=False)
    docs = load_named_corpus("hotpotqa")[:30]
    res = build_index(spec, root=home / "indexes", encoder=encoder, docs=docs)
    f = res.folder / "dense" / "emb-00000.npy"
    _garble(f, 200, 100)
    again = build_index(spec, root=home / "indexes", encoder=encoder, docs=docs)
    assert again.built  # the same-size damage is seen by the reuse check
    assert IndexManifest.read(again.folder).file_problems(again.folder, "full") == []


def test_server_answers_503_naming_the_index_for_a_corrupt_index(hp, home):
    from fastapi.testclient import TestClient

    from drgym.server.app import create_app

    folder = _copy(hp, home, "hp-serve")
    ip = folder / "bm25" / "indices.csc.index.npy"
    arr = np.load(ip)
    arr[:] = np.int32(10**9)
    np.save(ip, arr)
    engine = LocalSearchEngine(folder, method="bm25", verify="size")
    with TestClient(create_app(engine, close_backend=True)) as client:
        r = client.get("/search", params={"query": GALLU, "k": 3})
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["error"] == "corrupt_index" and body["index"] == "hp"  # the manifest's name
        assert "indices.csc.index.npy is unreadable" in body["detail"] and "drgym index build --force" in body["detail"]
        # a query whose words are in no passage touches no column: still answered
        r = client.get("/search", params={"query": "zzqxv wvvkq", "k": 3})
        assert r.status_code == 200 and r.json()["results"] == []


# -- CJK tokens -------------------------------------------------------------------------------


def test_tokenizer_bigrams_cjk_and_keeps_bm25s_tokens_for_other_text():
    import bm25s

    from drgym.index.bm25 import tokenize

    assert tokenize("床前明月光，疑是地上霜。举头望明月，低头思故乡。") == [
        "床前", "前明", "明月", "月光", "疑是", "是地", "地上", "上霜", "举头", "头望", "望明", "明月",
        "低头", "头思", "思故", "故乡"]
    assert tokenize("故 乡") == ["故", "乡"]  # runs of one character are unigrams
    assert tokenize("Li Bai (李白) wrote 静夜思 in 726") == ["li", "bai", "李白", "wrote", "静夜", "夜思", "726"]
    assert tokenize("スーパー・マリオ") == ["スー", "ーパ", "パー", "マリ", "リオ"]  # ・ separates
    # text without CJK characters: exactly bm25s's tokens (wiki-default's English rankings unchanged)
    texts = [f"{d.title}\n{d.text}" for d in load_named_corpus("hotpotqa")]
    ref = bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)
    import re

    from drgym.index.bm25 import CJK_RANGES

    plain = [i for i, t in enumerate(texts) if not re.search(f"[{CJK_RANGES}]", t)]
    assert len(plain) == 976
    assert all(tokenize(texts[i]) == ref[i] for i in plain)


def _zh_docs():
    return [
        Document("zh-1", "https://zh.example.org/jingyesi", "静夜思", "床前明月光，疑是地上霜。举头望明月，低头思故乡。",
                 "test"),
        Document("zh-2", "https://zh.example.org/chunxiao", "春晓", "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
                 "test"),
        Document("zh-3", "https://zh.example.org/dengguanquelou", "登鹳雀楼", "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。",
                 "test"),
        Document("zh-4", "https://zh.example.org/guxiang", "故宫", "故宫位于北京，是明清两代的皇家宫殿。", "test"),
        Document("en-1", "https://en.example.org/moon", "The Moon", "The Moon is Earth's only natural satellite.",
                 "test"),
    ]


def test_chinese_query_finds_its_document_by_bm25(home, encoder):
    """``故乡`` (hometown) is inside ``低头思故乡``: bm25s's tokens kept the whole clause as
    one word, so the query found nothing; with bigrams it is rank 1 (and ``故宫``, which
    shares only the character 故, is not a hit)."""
    res = build_index(IndexSpec(corpus="zh-poems", name="zh", factory="Flat"), root=home / "indexes",
                      encoder=encoder, docs=_zh_docs())
    e = LocalSearchEngine(res.folder, method="bm25", collapse="passage")
    hits = e.search("故乡", 3)
    assert [h.doc_id for h in hits] == ["zh-1"] and hits[0].score > 0
    assert e.search("明月", 2)[0].doc_id == "zh-1"
    assert e.search("黄河入海", 2)[0].doc_id == "zh-3"
    assert [h.doc_id for h in e.search("moon satellite", 3)] == ["en-1"]
    assert e.with_method("hybrid").search("故乡", 1)[0].doc_id == "zh-1"
    e.close()


def test_legacy_bm25s_tokens_on_request_in_their_own_folder(home, encoder):
    """``bm25_tokenizer="bm25s"`` (a config pinned to rankings measured before CJK bigrams)
    builds bm25s's own tokens into a folder of its own name: ``故乡`` is not found there,
    while the default index beside it finds it, and English rankings agree."""
    spec = IndexSpec(corpus="zh-poems", factory="Flat", bm25_tokenizer="bm25s")
    assert spec.index_name("all-MiniLM-L6-v2").endswith("--bm25s")
    res = build_index(spec, root=home / "indexes", encoder=encoder, docs=_zh_docs())
    assert res.manifest.bm25["tokenizer"] == "bm25s" and res.folder.name.endswith("--bm25s")
    legacy = LocalSearchEngine(res.folder, method="bm25", collapse="passage")
    assert legacy.search("故乡", 3) == []
    assert [h.doc_id for h in legacy.search("moon satellite", 3)] == ["en-1"]
    # the same spec again reuses it; the default tokenizer gets another folder
    assert not build_index(spec, root=home / "indexes", encoder=encoder, docs=_zh_docs()).built
    default = build_index(IndexSpec(corpus="zh-poems", factory="Flat"), root=home / "indexes", encoder=encoder,
                          docs=_zh_docs())
    assert default.folder != res.folder
    assert LocalSearchEngine(default.folder, method="bm25", collapse="passage").search("故乡", 1)[0].doc_id == "zh-1"
    legacy.close()
    from drgym.errors import ConfigError

    with pytest.raises(ConfigError, match="bm25_tokenizer"):
        build_index(IndexSpec(corpus="zh-poems", name="zh-bad", factory="Flat", bm25_tokenizer="jieba"),
                    root=home / "indexes", encoder=encoder, docs=_zh_docs())


def test_old_bm25_index_keeps_its_tokens_and_is_rebuilt(home, encoder, caplog):
    """An index whose manifest records no tokenizer (format 2, before CJK bigrams) is
    queried with bm25s's tokens, as it was built, and ``build_index`` rebuilds it."""
    from drgym.index import bm25 as bm

    docs = _zh_docs()
    spec = IndexSpec(corpus="zh-poems", name="zh-old", factory="Flat")
    res = build_index(spec, root=home / "indexes", encoder=encoder, docs=docs)
    folder = res.folder
    # emulate the old build: bm25s's own tokens, no tokenizer recorded
    import bm25s

    r = bm25s.BM25()
    r.index(bm25s.tokenize([f"{d.title}\n{d.text}" for d in docs], stopwords="en", show_progress=False),
            show_progress=False)
    shutil.rmtree(folder / "bm25")
    r.save(str(folder / "bm25"))
    m = IndexManifest.read(folder)
    m.bm25.pop("tokenizer")
    m.format_version = 2
    from drgym.index.manifest import record_checksums, record_files

    m.files = record_files(folder)
    m.checksums = record_checksums(folder, m.files)
    m.write(folder)
    with caplog.at_level("INFO", logger="drgym.index.bm25"):
        e = LocalSearchEngine(folder, method="bm25", collapse="passage")
        assert e.search("低头思故乡", 1)[0].doc_id == "zh-1"  # the old token, whole
        assert e.search("故乡", 3) == []  # what the finding saw
    assert any("built before CJK bigram tokens" in r.getMessage() for r in caplog.records)
    e.close()
    again = build_index(spec, root=home / "indexes", encoder=encoder, docs=docs)
    assert again.built and again.manifest.bm25["tokenizer"] == bm.TOKENIZER
    assert LocalSearchEngine(again.folder, method="bm25").search("故乡", 1)[0].doc_id == "zh-1"


# -- fork after a multi-threaded search -------------------------------------------------------

FORK_SCRIPT = textwrap.dedent("""
    import os, sys, time, json
    import drgym
    from drgym.search.local import LocalSearchEngine

    folder, out = sys.argv[1], sys.argv[2]
    e = LocalSearchEngine(folder, method="dense", device="cpu")
    queries = [f"{w} river in Europe" for w in ("long", "short", "wide", "old")] * 8
    import faiss, torch
    assert torch.get_num_threads() == 2 and faiss.omp_get_max_threads() == 2, (torch.get_num_threads(),)
    parent = [[r.doc_id for r in rs] for rs in e.search_batch(queries[:16], 3)]   # 16 queries: torch threads
    e.search_batch(queries, 3)                                                    # 32 queries: faiss threads
    pid = os.fork()
    if pid == 0:
        try:
            child = [[r.doc_id for r in rs] for rs in e.search_batch(queries[:16], 3)]
            e.search_batch(queries, 3)
            with open(out, "w") as f:
                json.dump({"child": child, "threads": [torch.get_num_threads(), faiss.omp_get_max_threads()]}, f)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.2)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("child hung: killed after 60 s")
        sys.exit(3)
    print(json.dumps({"parent": parent}))
""")


def test_child_forked_after_a_multithreaded_search_can_search(hp, tmp_path):
    """With 2 threads, a child forked after a 16-query dense search used to hang in its
    first torch/FAISS call (libgomp's pool does not survive fork); now it searches, with
    one thread, and gets the parent's results. Bounded: the child is killed after 60 s."""
    out = tmp_path / "child.json"
    env = {**os.environ, "DRGYM_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", FORK_SCRIPT, str(hp.folder), str(out)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    parent = json.loads(proc.stdout.strip().splitlines()[-1])["parent"]
    child = json.loads(out.read_text())
    assert child["child"] == parent and len(parent) == 16 and all(len(r) == 3 for r in parent)
    assert child["threads"] == [1, 1]


@pytest.mark.slow
def test_a_drb_zh_task_finds_chinese_evidence_in_wiki_default():
    """DeepResearch Bench's drb-39 (a game developer asks for the player groups of game
    genres) against wiki-default by BM25: with CJK bigrams the Chinese video-game
    magazine's page ("Diànzǐ Yóuxì Ruǎnjiàn", whose passage names 电子游戏, video games) is the top hit; with bm25s's own
    tokens, which keep each Chinese clause as one word, BM25 finds nothing at all."""
    from drgym.envs.task_loaders import load_tasks
    from drgym.search.registry import backend_from_settings

    task = next(t for t in load_tasks("drb-zh") if t.task_id == "drb-39")
    cjk = backend_from_settings({"corpus": "wiki-default", "method": "bm25"})
    hits = cjk.search(task.question, k=5)
    assert hits and hits[0].title == "Diànzǐ Yóuxì Ruǎnjiàn" and "电子游戏" in hits[0].text
    legacy = backend_from_settings({"corpus": "wiki-default", "method": "bm25", "bm25_tokenizer": "bm25s"})
    assert legacy.search(task.question, k=5) == []
