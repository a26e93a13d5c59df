"""Corpora: readers for corpus formats, the built-in ``wiki-default``, chunking."""

from drgym.corpus.chunking import Passage, split_documents
from drgym.corpus.named import DEFAULT_CORPUS, NAMED, corpus_fingerprint, load_named_corpus
from drgym.corpus.readers import FORMATS, read_corpus, write_documents

__all__ = [
    "DEFAULT_CORPUS",
    "FORMATS",
    "NAMED",
    "Passage",
    "corpus_fingerprint",
    "load_named_corpus",
    "read_corpus",
    "split_documents",
    "write_documents",
]
