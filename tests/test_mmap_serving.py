"""Serving with the dense vectors memory-mapped (``LocalSearchEngine(mmap=True)``,
``drgym serve --mmap``): the same rankings, and the vectors out of the process's private
memory."""

from __future__ import annotations

import json
import subprocess
import sys

from envs_helpers import nq_open_questions


def test_mmap_engine_ranks_as_the_loaded_one(default_engine):
    from drgym.search.local import LocalSearchEngine

    qs = nq_open_questions(50)
    mapped = LocalSearchEngine(default_engine.folder, method="hybrid", device="cpu", mmap=True,
                               encoder=default_engine.encoder)
    try:
        for method in ("dense", "hybrid"):
            a = [[(r.doc_id, round(r.score, 5)) for r in res] for res in default_engine.search_batch(qs, 10, method=method)]
            b = [[(r.doc_id, round(r.score, 5)) for r in res] for res in mapped.search_batch(qs, 10, method=method)]
            assert a == b
    finally:
        mapped.close()


_PROBE = r"""
import json, sys
import numpy as np
from drgym.index.dense import DenseIndex
from drgym.index.manifest import IndexManifest

def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

folder, mmap = sys.argv[1], sys.argv[2] == "1"
m = IndexManifest.read(folder)
before = anon_kib()
d = DenseIndex(folder, m.shards, m.dim, m.n_passages, device="cpu", mmap=mmap)
q = np.random.default_rng(0).standard_normal((4, m.dim)).astype("float32")
q /= np.linalg.norm(q, axis=1, keepdims=True)
scores, rows = d.search(q, 10)
print(json.dumps({"anon_growth_kib": anon_kib() - before, "rows": np.asarray(rows).tolist()}))
"""


def test_mmap_keeps_the_vectors_out_of_private_memory(default_engine):
    """Loading wiki-default's Flat shard (21,126 x 384 float32, 32 MiB) grows the process's
    anonymous memory by about its size when read, and by almost nothing when mapped."""
    folder = str(default_engine.folder)
    out = {}
    for mmap in ("0", "1"):
        proc = subprocess.run([sys.executable, "-c", _PROBE, folder, mmap], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[mmap] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["0"]["rows"] == out["1"]["rows"]
    size_kib = default_engine.n_passages * 384 * 4 // 1024
    assert out["0"]["anon_growth_kib"] > 0.8 * size_kib, out
    assert out["1"]["anon_growth_kib"] < 0.25 * size_kib, out


def test_serve_settings_take_mmap():
    from drgym.search.wire import ServerSettings

    assert ServerSettings(mmap=True).mmap is True and ServerSettings().mmap is False
