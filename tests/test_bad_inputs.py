"""Bad input wherever a user types (issue 2.1): task files, corpus files, report files,
and broken index folders. Each case is a clear error naming the file (and line), or a
skip that is counted and stated; nothing is dropped silently."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drgym.cli import app
from drgym.envs.task_loaders import MAX_QUESTION_CHARS, load_hf_tasks, load_tasks
from drgym.errors import ConfigError, CorpusError

def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- task files ----------------------------------------------------------------------------
def test_task_file_rows_that_cannot_be_tasks_are_skipped_and_counted(tmp_path, caplog):
    p = tmp_path / "tasks.jsonl"
    lines = [
        json.dumps({"question": "Capital of France?", "answer": "Paris"}),           # line 1: kept
        "",                                                                           # line 2: blank
        json.dumps({"question": "Who wrote Hamlet?"}),                               # line 3: no answer field
        json.dumps({"question": "2+2?", "answer": None}),                            # line 4: null answer
        json.dumps({"question": "x" * (10 * 1024 * 1024), "answer": "x"}),           # line 5: a 10 MB question
        json.dumps({"question": "  ", "answer": "y"}),                               # line 6: empty question
        json.dumps({"question": "Largest planet?", "answer": ["Jupiter", ""]}),      # line 7: kept
    ]
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        tasks = load_tasks(str(p))
    assert [(t.task_id, t.question, t.answers) for t in tasks] == [
        ("tasks-0", "Capital of France?", ["Paris"]), ("tasks-5", "Largest planet?", ["Jupiter"])]
    [msg] = _warnings(caplog)
    assert msg == (f"{p}: skipped 4 of 6 rows, 2 tasks left: 2 without an answer (lines 3, 4); "
                   f"1 with a question over {MAX_QUESTION_CHARS:,} characters (line 5); 1 without a question (line 6); "
                   "1 blank line ignored (line 2)")


def test_task_file_answer_columns_and_missing_ones(tmp_path):
    golden = tmp_path / "searchr1.jsonl"  # Search-R1 / FlashRAG files hold golden_answers
    golden.write_text(json.dumps({"id": "q7", "question": "Who?", "golden_answers": ["Ann", "Anne"]}) + "\n", encoding="utf-8")
    assert [(t.task_id, t.answers) for t in load_tasks(str(golden))] == [("searchr1-0", ["Ann", "Anne"])]
    none = tmp_path / "none.jsonl"
    none.write_text(json.dumps({"question": "Who?", "gold": "Ann"}) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"none\.jsonl has no answer column 'answer' / 'answers' / 'golden_answers'; columns: question, gold"):
        load_tasks(str(none))
    allbad = tmp_path / "allbad.csv"
    allbad.write_text("question,answer\nWho?,\nWhat?,\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"allbad\.csv holds no usable task \(2 without an answer\)"):
        load_tasks(str(allbad))
    dup = tmp_path / "dup.jsonl"
    dup.write_text("".join(json.dumps({"qid": "a", "question": f"q{i}", "answer": "x"}) + "\n" for i in range(2)), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"dup\.jsonl: lines 1 and 2 have the same id 'dup-a'"):
        load_hf_tasks(dup, id_key="qid")


def test_task_files_that_are_not_utf8_name_the_line(tmp_path):
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(json.dumps({"question": "q", "answer": "a"}).encode() + b"\n"
                  + b'{"question": "caf\xe9?", "answer": "a"}\n')
    with pytest.raises(CorpusError, match=r"latin1\.jsonl:2 is not UTF-8 text \(byte 0xe9 at column 18\); save the file as UTF-8"):
        load_tasks(str(p))
    c = tmp_path / "latin1.csv"
    c.write_bytes(b"question,answer\nq,a\nq2,a\nBeyonc\xe9?,x\n")
    with pytest.raises(CorpusError, match=r"latin1\.csv:4 is not UTF-8 text \(byte 0xe9"):
        load_tasks(str(c))
    # through the CLI: one line on stderr, exit status 2, before the index or a model loads
    res = CliRunner().invoke(app, ["rollout", "--policy", "scripted", "--tasks", str(p), "--out", str(tmp_path / "r"),
                                   "--no-progress"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert [ln for ln in res.output.splitlines() if ln.startswith("error:")] == [
        f"error: {p}:2 is not UTF-8 text (byte 0xe9 at column 18); save the file as UTF-8."]


def test_a_rollout_runs_the_usable_tasks_and_says_what_it_skipped(bm25_backend, tmp_path, caplog):
    from drgym.evaluation.runner import RolloutConfig, run_rollout

    p = tmp_path / "mine.jsonl"
    rows = [{"question": "If Gallu is a demon Lilu is what?", "answer": "a spirit"}, {"question": "No answer here?"},
            {"question": "Where is Funchal?", "answers": ["Madeira"]}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        res = run_rollout(RolloutConfig(policy="scripted", tasks=str(p), n=None, out=str(tmp_path / "r"), plots=False),
                          backend=bm25_backend, progress=False)
    assert [d["task_id"] for d in res.trajectories] == ["mine-0", "mine-2"]
    assert res.metrics["tasks_total"] == 2
    assert any("skipped 1 of 3 rows, 2 tasks left: 1 without an answer (line 2)" in m for m in _warnings(caplog))


# -- corpus files --------------------------------------------------------------------------
def _wiki18(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in rows), encoding="utf-8")
    return path


def _build(corpus: Path, fmt: str, root: Path):
    from drgym.index.build import IndexSpec, build_index, get_encoder

    return build_index(IndexSpec(corpus=str(corpus), format=fmt), root=root, encoder=get_encoder("all-MiniLM-L6-v2", "cpu"))


def test_corpus_duplicate_id_is_an_error_naming_the_file(tmp_path):
    p = _wiki18(tmp_path / "dup.jsonl", [("1", '"Paris"\nParis is the capital of France.'), ("2", '"Rome"\nRome is in Italy.'),
                                         ("1", '"Paris (band)"\nA band.')])
    with pytest.raises(CorpusError, match=r"dup\.jsonl: Duplicate doc_id '1' in corpus"):
        _build(p, "wiki18", tmp_path / "ix")
    res = CliRunner().invoke(app, ["index", "build", "--corpus", str(p), "--format", "wiki18", "--root", str(tmp_path / "ix2")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    [line] = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert f"{p}: Duplicate doc_id '1'" in line


def test_corpus_rows_without_text_are_skipped_and_counted(tmp_path, caplog):
    p = _wiki18(tmp_path / "c.jsonl", [("1", '"Paris"\nParis is the capital of France.'), ("2", '"Empty"\n'),
                                       ("3", '"Rome"\nRome is in Italy.'), ("4", '"Blank"\n   ')])
    web = tmp_path / "web.jsonl"
    web.write_text("".join(json.dumps(r) + "\n" for r in [{"id": "a", "url": "http://x/a", "text": "Some text."},
                                                          {"id": "b", "url": "http://x/b", "text": None}]), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        built = _build(p, "wiki18", tmp_path / "ix")
        built_web = _build(web, "web", tmp_path / "ix")
    assert (built.manifest.n_documents, built_web.manifest.n_documents) == (2, 1)
    assert [m for m in _warnings(caplog) if "no text" in m] == [
        f"{p.resolve()}: skipped 2 documents with no text: doc_ids '2', '4'",
        f"{web.resolve()}: skipped 1 document with no text: doc_ids 'b'"]
    from drgym.docstore import DocStore

    assert [d.title for d in (DocStore(built.folder / "docs.sqlite").get(i) for i in ("1", "3"))] == ["Paris", "Rome"]


def test_corpus_files_that_are_not_utf8_or_json_name_the_line(tmp_path):
    from drgym.corpus.readers import read_corpus

    p = tmp_path / "c.jsonl"
    p.write_bytes(b'{"id": 1, "contents": "\\"A\\"\\nok"}\n{"id": 2, "contents": "\\"B\\"\\nna\xefve"}\n')
    with pytest.raises(CorpusError, match=r"c\.jsonl:2 is not UTF-8 text \(byte 0xef"):
        list(read_corpus(p, "wiki18"))
    j = tmp_path / "h.json"
    j.write_bytes(b'[{"title": "A", "text": "x"},\n {"title": "B\xff", "text": "y"}]')
    with pytest.raises(CorpusError, match=r"h\.json:2 is not UTF-8 text \(byte 0xff"):
        list(read_corpus(j, "hipporag"))
    bad = tmp_path / "t.json"
    bad.write_text('[{"title": "A", "text": "x"},\n {"title": "B" "text": "y"}]', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"t\.json:2 is not valid JSON \(Expecting ',' delimiter"):
        list(read_corpus(bad, "hipporag"))


def test_report_file_not_utf8(tmp_path):
    from drgym.cli.evaluate import read_reports

    p = tmp_path / "reports.jsonl"
    p.write_bytes(b'{"id": "1", "prompt": "p", "article": "\x80"}\n')
    with pytest.raises(ConfigError, match=r"reports\.jsonl:1 is not UTF-8 text \(byte 0x80 at column 40\)"):
        read_reports(p)


# -- broken index folders, through the CLI -------------------------------------------------
def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*-wal", "*-shm"))
    return dst


def _search(index: Path) -> tuple[int, list[str], str]:
    res = CliRunner().invoke(app, ["search", "Who wrote Dracula?", "-k", "2", "--index", str(index), "--method", "hybrid"])
    return res.exit_code, [ln for ln in res.output.splitlines() if ln.startswith("error:")], res.output


def test_broken_index_files_give_one_line_naming_the_file(hotpotqa_engine, tmp_path):
    src = hotpotqa_engine.folder
    manifest = json.loads((src / "manifest.json").read_text())
    faiss_rel = manifest["shards"][0]["faiss"]
    cases = {}
    # a truncated FAISS file
    t = _copy(src, tmp_path / "truncated")
    (t / faiss_rel).write_bytes((src / faiss_rel).read_bytes()[:4096])
    cases["truncated FAISS"] = (t, [str(t / faiss_rel), "truncated or overwritten", "drgym index build --force"])
    # a FAISS file of the right size but garbage
    g = _copy(src, tmp_path / "garbage-faiss")
    (g / faiss_rel).write_bytes(bytes([0x13]) * (src / faiss_rel).stat().st_size)
    cases["corrupt FAISS"] = (g, [str(g / faiss_rel), "unreadable", "rebuild the index"])
    # a docstore of the right size but not SQLite
    d = _copy(src, tmp_path / "corrupt-docstore")
    (d / "docs.sqlite").write_bytes(b"g" * (src / "docs.sqlite").stat().st_size)
    # (found by its checksum before SQLite opens it)
    cases["corrupt docstore"] = (d, [str(d / "docs.sqlite"), "unreadable", "another content", "rebuild the index"])
    # a manifest from a newer drgym
    n = _copy(src, tmp_path / "newer")
    from drgym.index.manifest import FORMAT_VERSION

    newer = {**manifest, "format_version": FORMAT_VERSION + 1, "shard_layout": "v9"}
    (n / "manifest.json").write_text(json.dumps(newer))
    cases["newer manifest"] = (n, [str(n / "manifest.json"), f"index format {FORMAT_VERSION + 1}, written by a newer drgym",
                                   "upgrade drgym (pip install -U drgym)", "drgym index build --force"])
    for name, (folder, needles) in cases.items():
        code, errors, out = _search(folder)
        assert code == 2 and len(errors) == 1 and "Traceback" not in out, (name, out[-2000:])
        for needle in needles:
            assert needle in errors[0], (name, errors[0])


# -- a read-only or full DRGYM_HOME (a private tmpfs in a user+mount namespace) ----------------
def _namespaces_work() -> bool:
    import subprocess

    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || "
                               "mount -t tmpfs -o size=64k tmpfs /tmp"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _in_tmpfs(home: Path, size: str, drgym_args: list[str], *, populate: Path | None = None, readonly: bool = False):
    """Run ``python -m drgym ARGS`` with DRGYM_HOME on a fresh tmpfs of ``size`` (read-only
    when asked, after copying ``populate`` into it as an index), then list what is left in
    ``$DRGYM_HOME/indexes``."""
    import os
    import subprocess
    import sys

    home.mkdir()
    script = ['set -e', f'mount -t tmpfs -o size={size} tmpfs "{home}"']
    if populate is not None:
        script.append(f'mkdir -p "{home}/indexes" && cp -r "{populate}" "{home}/indexes/" && rm -f "{home}"/indexes/*/*-wal "{home}"/indexes/*/*-shm')
    if readonly:
        script.append(f'mount -o remount,ro "{home}"')
    script += ['set +e', " ".join(f"'{a}'" for a in [sys.executable, "-m", "drgym", *drgym_args]), "rc=$?",
               f'echo "left: $(ls -A "{home}/indexes" 2>/dev/null | tr "\\n" " ")"', "exit $rc"]
    env = {**os.environ, "DRGYM_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(["unshare", "-rm", "sh", "-c", "\n".join(script)], env=env, capture_output=True, text=True,
                          timeout=900)


needs_namespaces = pytest.mark.skipif(not _namespaces_work(), reason="needs unshare -rm (user + mount namespaces) for a private tmpfs")


@pytest.mark.slow
@needs_namespaces
def test_read_only_drgym_home(hotpotqa_engine, tmp_path):
    # empty and read-only: the index cannot be built -> one line naming the folder and the fix
    res = _in_tmpfs(tmp_path / "ro", "4m", ["search", "Who wrote Dracula?", "-k", "2", "--corpus", "hotpotqa"], readonly=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    [line] = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert line == (f"error: cannot write {tmp_path / 'ro' / 'indexes'}: Read-only file system (DRGYM_HOME is "
                    f"{tmp_path / 'ro'}: the file system is read-only, or point DRGYM_HOME at a writable folder with room).")
    # read-only but holding the built index: searching works (nothing is written)
    res = _in_tmpfs(tmp_path / "ro2", "64m", ["search", "Who wrote Dracula?", "-k", "2", "--corpus", "hotpotqa", "--json"],
                    populate=hotpotqa_engine.folder, readonly=True)
    assert res.returncode == 0, res.stderr[-3000:]
    hits = json.loads(res.stdout[: res.stdout.rindex("]") + 1])
    assert [h["doc_id"] for h in hits] == [r.doc_id for r in hotpotqa_engine.search("Who wrote Dracula?", 2)]


@pytest.mark.slow
@needs_namespaces
def test_full_drgym_home(tmp_path):
    home = tmp_path / "full"
    res = _in_tmpfs(home, "1m", ["index", "build", "--corpus", "hotpotqa"])
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    [line] = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    build_dir = home / "indexes" / ".build-hotpotqa--all-MiniLM-L6-v2--Flat"
    assert line == (f"error: cannot write {build_dir}: No space left on device (DRGYM_HOME is {home}: the disk is full: "
                    "free some space, or point DRGYM_HOME at a writable folder with room).")
    # only the partial build is left (resumed by the next build): nothing a load takes for an index
    left = res.stdout.strip().splitlines()[-1].removeprefix("left:").split()
    assert ".build-hotpotqa--all-MiniLM-L6-v2--Flat" in left and "hotpotqa--all-MiniLM-L6-v2--Flat" not in left


def test_no_progress_hides_the_model_libraries_bars(monkeypatch, capsys):
    """``--no-progress`` also silences transformers' "Loading weights" bar and the plain
    tqdm bar of its GGUF reader, which a log or a pipe otherwise fills with."""
    from functools import partialmethod

    import tqdm as tqdm_module
    from tqdm.auto import tqdm
    from transformers.utils import logging as hf_logging

    from drgym.cli.rollout import quiet_model_loading

    monkeypatch.setenv("TQDM_DISABLE", "0")  # restored (unset) after the test
    init = tqdm_module.std.tqdm.__dict__["__init__"]  # an earlier CLI test in this process may have patched it
    monkeypatch.setattr(tqdm_module.std.tqdm, "__init__", init.func if isinstance(init, partialmethod) else init)
    hf_logging.enable_progress_bar()
    try:
        list(tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
        assert "Converting" in capsys.readouterr().err  # shown before
        quiet_model_loading()
        assert not hf_logging.is_progress_bar_enabled()
        list(tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
        list(hf_logging.tqdm(range(3), desc="Loading weights"))
        err = capsys.readouterr().err
        assert "Converting" not in err and "Loading weights" not in err
    finally:
        hf_logging.enable_progress_bar()
