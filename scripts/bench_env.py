"""Benchmark the environments' step overhead, without and with search, single and batched.

Writes JSON (stdout, and ``--out`` if given) with median per-step times in milliseconds:

- ``overhead``: env work only, with the search calls answered by a stub that returns
  precomputed results (parse, budgets, formatting, truncation, messages, info,
  trajectory). Per action kind: an invalid action, a search turn (3 results), a fetch
  turn, and an answer turn (incl. the F1 reward). Target: < 1 ms.
- ``local_single``: a full step with the local engine (``--engine``), one env.
- ``local_batched``: ``--batch`` envs stepped by :class:`drgym.envs.driver.BatchedDriver`
  (one ``search_batch`` per turn); per-turn median and per-env share.

Run: ``python scripts/bench_env.py --out bench_env.json`` (``--engine bm25`` uses bm25s over
the HippoRAG paragraphs and needs no index build; ``--engine default`` builds or loads the
wiki-default index, ``LocalSearchEngine.from_corpus("wiki-default")``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 4)


class Stub:
    """A SearchBackend answering from a fixed result list (no search cost)."""

    def __init__(self, inner, queries):
        from drgym.search.base import SearchBackend

        res = inner.search_batch(queries, 3)
        doc = inner.fetch(res[0][0].url)

        class _S(SearchBackend):
            name = "stub"

            def search_batch(self, qs, k=10):
                return [res[i % len(res)][:k] for i in range(len(qs))]

            def fetch(self, url):
                return doc

        self.backend = _S()
        self.url = res[0][0].url


def bench_overhead(inner, tasks, n: int) -> dict:
    import drgym.envs  # noqa: F401
    import gymnasium as gym

    stub = Stub(inner, [t.question for t in tasks[:20]])
    env = gym.make("drgym/SearchQA-v0", backend=stub.backend, tasks=tasks, max_turns=10, max_searches=10, max_fetches=10).unwrapped
    kinds = {
        "invalid": "I think the answer is probably in the documents.",
        "search": "<think>Look it up.</think><search> {q} </search>",
        "fetch": f"<fetch> {stub.url} </fetch>",
        "answer": "<answer> a spirit </answer>",
    }
    out = {}
    for kind, template in kinds.items():
        times = []
        for i in range(n):
            env.reset(seed=i)
            action = template.format(q=env.task.question)
            t0 = time.perf_counter()
            env.step(action)
            times.append(time.perf_counter() - t0)
        out[kind] = _median_ms(times)
    # a whole scripted episode (search, fetch, answer), per step
    from drgym.policies.scripted import ScriptedPolicy

    pol = ScriptedPolicy()
    times = []
    for i in range(n // 3 + 1):
        _, info = env.reset(seed=i)
        done = False
        while not done:
            a = pol.act_one(info)
            t0 = time.perf_counter()
            _, _, term, trunc, info = env.step(a)
            times.append(time.perf_counter() - t0)
            done = term or trunc
    out["scripted_episode_step"] = _median_ms(times)
    return out


def bench_local(backend, tasks, n_single: int, batch: int, n_batches: int) -> dict:
    import drgym.envs  # noqa: F401
    import gymnasium as gym
    from drgym.envs.driver import BatchedDriver

    env = gym.make("drgym/SearchQA-v0", backend=backend, tasks=tasks).unwrapped
    # warm-up (encoder load, caches)
    env.reset(seed=0)
    env.step(f"<search> {tasks[0].question} </search>")
    search_times, fetch_times = [], []
    for i in range(n_single):
        env.reset(seed=i)
        t0 = time.perf_counter()
        _, _, _, _, info = env.step(f"<search> {env.task.question} </search>")
        search_times.append(time.perf_counter() - t0)
        url = info["results"][0]["url"]
        t0 = time.perf_counter()
        env.step(f"<fetch> {url} </fetch>")
        fetch_times.append(time.perf_counter() - t0)
    single = {"search_step": _median_ms(search_times), "fetch_step": _median_ms(fetch_times), "n": n_single}

    driver = BatchedDriver([gym.make("drgym/SearchQA-v0", backend=backend, tasks=tasks) for _ in range(batch)])
    turn_times = []
    for b in range(n_batches):
        driver.reset(seeds=[b * batch + i for i in range(batch)])
        actions = [f"<search> {e.task.question} </search>" for e in driver.raw]
        t0 = time.perf_counter()
        driver.step(actions)
        turn_times.append(time.perf_counter() - t0)
    driver.close()
    per_turn = statistics.median(turn_times)
    batched = {"batch": batch, "search_turn": _median_ms(turn_times), "per_env": round(per_turn / batch * 1e3, 4),
               "speedup_vs_single": round(statistics.median(search_times) / (per_turn / batch), 2), "n_turns": n_batches}
    return {"single": single, "batched": batched}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["bm25", "default"], default="bm25")
    ap.add_argument("--method", default="hybrid", help="search method of the default engine (dense, bm25, hybrid)")
    ap.add_argument("--n", type=int, default=300, help="steps per overhead measurement")
    ap.add_argument("--n-single", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--n-batches", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from drgym.envs.task_loaders import load_tasks

    tasks = load_tasks("hotpotqa-dev")
    t0 = time.perf_counter()
    if args.engine == "bm25":
        from envs_helpers import BM25Backend

        backend = BM25Backend("hipporag")
        engine_desc = "bm25s over HippoRAG hotpotqa+musique+2wiki paragraphs (tests/envs_helpers.py)"
    else:
        from drgym.search.local import LocalSearchEngine

        backend = LocalSearchEngine.from_corpus("wiki-default", method=args.method)
        engine_desc = repr(backend)
    load_s = time.perf_counter() - t0

    result = {
        "benchmark": "bench_env",
        "unit": "milliseconds, median",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "engine": engine_desc,
        "engine_load_s": round(load_s, 2),
        "overhead": bench_overhead(backend, tasks, args.n),
        "overhead_target_ms": 1.0,
    }
    result.update({f"local_{k}": v for k, v in bench_local(backend, tasks, args.n_single, args.batch, args.n_batches).items()})
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        from drgym.atomic import atomic_write_text

        atomic_write_text(args.out, text + "\n")


if __name__ == "__main__":
    main()
