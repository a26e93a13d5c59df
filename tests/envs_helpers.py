"""A small real search backend for the env tests: bm25s over HippoRAG's HotpotQA paragraphs.

Used where a test must not depend on the default dense index (fast, 994 real passages,
deterministic), and to inject backend failures.
"""

from __future__ import annotations

import contextlib
import os
import threading

from drgym.errors import BackendUnavailableError, DocumentNotFoundError
from drgym.search.base import SearchBackend
from drgym.types import Document, SearchResult


class BM25Backend(SearchBackend):
    """bm25s (English stop words, no stemming) over named-corpus documents, title + text."""

    name = "bm25-test"
    deterministic = True

    def __init__(self, corpus: str = "hotpotqa") -> None:
        import bm25s

        from drgym.corpus.named import load_named_corpus

        self.docs = load_named_corpus(corpus)
        self.by_url = {d.url: d for d in self.docs}
        self._bm25s = bm25s
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize([f"{d.title} {d.text}" for d in self.docs], stopwords="en", show_progress=False), show_progress=False)
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def search_batch(self, queries, k=10):
        self.check_request(queries, k)
        with self._lock:
            self.calls.append(list(queries))
            toks = self._bm25s.tokenize(list(queries), stopwords="en", show_progress=False)
            ids, scores = self.retriever.retrieve(toks, k=min(k, len(self.docs)), show_progress=False, n_threads=1)
        out = []
        for row_ids, row_scores in zip(ids, scores):
            res = []
            for i, s in zip(row_ids, row_scores):
                d = self.docs[int(i)]
                res.append(SearchResult(d.doc_id, d.url, d.title, d.text, float(s), len(res) + 1, d.source))
            out.append(res)
        return out

    def fetch(self, url):
        if url not in self.by_url:
            raise DocumentNotFoundError(f"No document has URL {url!r}.")
        return self.by_url[url]


class FailingBackend(SearchBackend):
    """Wraps a backend; queries containing ``fail`` make the whole batch raise."""

    name = "failing"

    def __init__(self, inner: SearchBackend) -> None:
        self.inner = inner

    def search_batch(self, queries, k=10):
        if any("fail" in q for q in queries):
            raise BackendUnavailableError("search service unreachable after 3 retries")
        return self.inner.search_batch(queries, k)

    def fetch(self, url: str) -> Document:
        return self.inner.fetch(url)


class Counting(SearchBackend):
    """Records every search_batch call of a wrapped backend (``batches``: each call's queries)."""

    name = "counting"

    def __init__(self, inner):
        self.inner = inner
        self.max_k = inner.max_k
        self.batches: list[list[str]] = []

    def search_batch(self, queries, k=10):
        self.batches.append(list(queries))
        return self.inner.search_batch(queries, k)

    def fetch(self, url):
        return self.inner.fetch(url)


@contextlib.contextmanager
def drgym_home(home):
    """Point ``DRGYM_HOME`` at ``home`` for the duration, then restore the old value (or unset it)."""
    old = os.environ.get("DRGYM_HOME")
    os.environ["DRGYM_HOME"] = str(home)
    try:
        yield home
    finally:
        if old is None:
            os.environ.pop("DRGYM_HOME", None)
        else:
            os.environ["DRGYM_HOME"] = old


def load_script(name: str):
    """``scripts/<name>.py`` of this repository as a module (scripts are not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def nq_open_questions(n: int) -> list[str]:
    """The first ``n`` real NQ-open questions (the shipped dev set), for encoder and ranking tests."""
    from drgym.envs import load_tasks

    return [t.question for t in load_tasks("nq-open")][:n]


@contextlib.contextmanager
def engine_with_encoder(default_engine, backend: str):
    """The wiki-default index of ``default_engine`` served (hybrid, CPU) with query encoder
    ``backend`` (``"torch"``, ``"onnx"``, ``"onnx-int8"``: exported and quantised once into
    DRGYM_HOME)."""
    from drgym.search.local import LocalSearchEngine

    engine = LocalSearchEngine(default_engine.folder, method="hybrid", device="cpu", encoder_backend=backend)
    try:
        yield engine
    finally:
        engine.close()
