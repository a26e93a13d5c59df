"""training/callbacks.py's metrics.jsonl records: each carries the trainer's resident memory."""

from __future__ import annotations

import sys

import pytest


class _State:
    is_world_process_zero = True
    epoch = 0.5

    def __init__(self, step):
        self.global_step = step


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_each_record_carries_the_rss_and_it_sees_an_allocation(tmp_path):
    import mmap

    from drgym.training.callbacks import JsonlLoggerCallback, read_metrics, rss_mib

    cb = JsonlLoggerCallback(tmp_path / "metrics.jsonl")
    cb.on_log(None, _State(1), None, logs={"loss": 0.5})
    # 64 MiB of fresh anonymous pages, all touched: a numpy array may reuse heap memory that an
    # earlier test freed and the allocator kept resident, and then the RSS does not move
    block = mmap.mmap(-1, 64 * 2**20)
    for i in range(0, len(block), mmap.PAGESIZE):
        block[i] = 1
    cb.on_log(None, _State(2), None, logs={"loss": 0.25})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["loss"] == 0.25
    grown = rows[1]["memory/rss_mib"] - rows[0]["memory/rss_mib"]
    assert 60 <= grown <= 80, grown
    assert abs(rss_mib() - rows[1]["memory/rss_mib"]) < 16
    block.close()
