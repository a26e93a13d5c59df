"""Compute the shipped embedding cache of the default corpus (run once by maintainers).

    python scripts/make_embedding_cache.py [--corpus wiki-default] [--encoder all-MiniLM-L6-v2]

Writes ``drgym/data/embeddings/<encoder>-<revision>/{keys,vectors}.npy``: one float16
vector per passage of the corpus as split by the default index settings. Takes about
11 minutes on 2 CPU cores for wiki-default.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from drgym.corpus import load_named_corpus, split_documents
from drgym.corpus.chunking import default_max_tokens
from drgym.embedding import EmbeddingCache, Encoder, model_key, shipped_cache_dir, text_keys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", default="wiki-default")
    ap.add_argument("--encoder", default="all-MiniLM-L6-v2")
    ap.add_argument("--overlap", type=int, default=32)
    args = ap.parse_args()
    enc = Encoder(args.encoder, batch_size=32)
    docs = load_named_corpus(args.corpus)
    passages = split_documents(docs, enc.tokenizer, max_tokens=default_max_tokens(enc.max_length), overlap=args.overlap)
    texts = list(dict.fromkeys(p.embed_text for p in passages))  # unique texts, in order
    t = time.time()
    vecs = enc.encode_passages(texts, show_progress=True)
    dt = time.time() - t
    out = shipped_cache_dir(enc)
    EmbeddingCache.write(out, text_keys(texts, model_key(enc)), vecs)
    print(json.dumps({"out": str(out), "passages": len(passages), "unique_texts": len(texts),
                      "seconds": round(dt, 1), "passages_per_s": round(len(texts) / dt, 1),
                      "dim": enc.dim, "revision": enc.revision, "max_abs_norm_err": float(np.abs(np.linalg.norm(vecs, axis=1) - 1).max())}))


if __name__ == "__main__":
    main()
