"""Render the documentation's figure tables from the committed JSON, so that no figure is typed.

    python scripts/readme_tables.py            # print every table
    python scripts/readme_tables.py --write    # put them into their pages under docs/
    python scripts/readme_tables.py --check    # exit 1 when a page differs (tests/test_readme_tables.py)

Each table sits in its page (TABLE_PAGES: the table's name to the markdown file, relative
to the repository) between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` (invisible
in rendered markdown); everything between the two markers is generated.

Tables and their sources:

- ``main_job``: ``scripts/results/main_job/NAME/{metrics,config,run}.json``, written by
  ``python scripts/main_job.py``. To add a row (a trained agent, another model), run it
  with ``scripts/main_job.py --add NAME "ARGS"`` and add ``(NAME, label)`` to MAIN_JOB_ROWS.
- ``bench_search`` and ``retrieval``: ``scripts/results/bench_search_*.json``
  (``python scripts/bench_search.py``), one column per file in BENCH_SEARCH_RUNS.
- ``search_profile`` and ``search_encoders``: ``scripts/results/bench_search_profile*.json``
  (``python scripts/bench_search.py --profile 300``); ``search_encoders`` has one row per
  query encoder of SEARCH_ENCODER_ROWS.
- ``search_profile_default`` and ``peer_default``: ``scripts/results/bench_search_profile_default.json``
  and ``scripts/results/bench_search_peer_default.json`` (``python scripts/bench_search.py
  --profile-default 300`` and ``--peer-default --search-r1 RETRIEVAL_SERVER_PY``).
- ``calibration_source``: ``scripts/results/bench_calibration_source.json``
  (``python scripts/bench_calibration_source.py``).
- ``encoder_choice``: ``scripts/results/bench_encoder_choice.json``
  (``python scripts/bench_encoder_choice.py``), the default query encoder's decision.
- ``bench_train``: ``training/results/bench_train*.json`` (``python scripts/bench_train.py``),
  one row per entry of BENCH_TRAIN_ROWS.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _load(rel: str) -> dict:
    return json.loads((REPO / rel).read_text(encoding="utf-8"))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"



def _search_r1_version(r: dict) -> str:
    """`` (Search-R1 commit `abcdef123456`)`` for a bench record that names the peer's commit, else ``""``."""
    commit = (r.get("search_r1") or {}).get("commit")
    return f" (Search-R1 commit `{commit[:12]}`)" if commit else ""

def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join([_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)])


def _pct(x: float) -> str:
    """A share as a percentage: one decimal, but ``0 %`` and ``100 %`` exact."""
    return f"{100 * x:.0f} %" if x in (0, 1) else f"{100 * x:.1f} %"


# -- main job ---------------------------------------------------------------------------

MAIN_JOB_DIR = "scripts/results/main_job"
# (folder under MAIN_JOB_DIR, label in the table); the rows appear in this order.
MAIN_JOB_DEMO_ROWS: list[tuple[str, str]] = [
    ("demo_hf_smollm2_drgym", "`hf:smollm2-drgym` (SmolLM2 + LoRA trained in drgym; the main job)"),
    ("demo_hf_smollm2", "`hf:smollm2` (scaffold)"),
    ("demo_rag_smollm2", "`rag:smollm2`"),
    ("demo_scripted", "`scripted`"),
]
"""The main job's own slice, ``synth-demo``."""
MAIN_JOB_ROWS: list[tuple[str, str]] = [
    ("hf_smollm2", "`hf:smollm2` (scaffold)"),
    ("rag_smollm2", "`rag:smollm2`"),
    ("scripted", "`scripted`"),
    ("hf_smollm2_drgym", "`hf:smollm2-drgym` (SmolLM2 + LoRA, SFT + GRPO in drgym)"),
    ("hf_smollm2_avx2", "`hf:smollm2` on AVX2 kernels only (`ATEN_CPU_CAPABILITY=avx2`)"),
]


def main_job_demo() -> str:
    """The main job's table on ``synth-demo`` (the default slice)."""
    return main_job(MAIN_JOB_DEMO_ROWS)


def main_job(rows_of: list[tuple[str, str]] | None = None) -> str:
    rows, cpus, dates = [], set(), []
    for name, label in rows_of or MAIN_JOB_ROWS:
        m = _load(f"{MAIN_JOB_DIR}/{name}/metrics.json")
        run = _load(f"{MAIN_JOB_DIR}/{name}/run.json")
        rows.append([
            label, f"{m['em']:.3f}", f"{m['f1']:.3f}", f"{m['cover_em']:.3f}", _pct(m["answer_rate"]),
            _pct(m["invalid_action_rate"]), f"{m['turns']:.2f}", f"{m['searches']:.2f}",
            f"{m['fetches']:.2f}".replace("0.00", "0"), f"{m['completion_tokens']:.0f}",
            f"{m['wall_s_per_episode']:.2f}",
            f"{max(run['load_avg_1_5_15_before'][0], run['load_avg_1_5_15_after'][0]):.1f}",
        ])
        cpu = run["cpu"]
        cpus.add(f"{cpu['cores']} cores of an {cpu['model']} CPU ({'with' if cpu['avx512_bf16'] else 'without'} "
                 "AVX512-BF16)")
        dates.append(run["started"][:10])
    header = ["policy", "EM", "F1", "cover-EM", "answer rate", "invalid actions", "turns", "searches", "fetches",
              "gen tokens / ep", "wall s / ep", "load"]
    note = (f"One run each, {min(dates)}{'' if len(set(dates)) == 1 else ' to ' + max(dates)}, on "
            f"{'; '.join(sorted(cpus))}; load: the 1-minute load average (the higher of before and after the run). "
            f"Figures from `{MAIN_JOB_DIR}/` (`python scripts/main_job.py`).")
    return _table(header, rows) + "\n\n" + note


# -- search benchmark -------------------------------------------------------------------

# (JSON file, column title); one column each.
BENCH_SEARCH_RUNS: list[tuple[str, str]] = [
    ("scripts/results/bench_search_run1.json", "run 1"),
    ("scripts/results/bench_search_run2.json", "run 2"),
]


def _met(runs: list[dict], key: str) -> str:
    n = sum(bool(r["targets_met"][key]) for r in runs)
    return "✓" if n == len(runs) else f"met in {n} of {len(runs)} runs"


def bench_search() -> str:
    runs = [_load(f) for f, _ in BENCH_SEARCH_RUNS]

    def level(r: dict, clients: int) -> dict:
        return next(x for x in r["http"]["levels"] if x["clients"] == clients)

    def lat(r: dict, key: str, digits: int = 1) -> str:
        v = r["latency"][key]
        return f"p50 {v['p50_ms']:.{digits}f} ms, p99 {v['p99_ms']:.{digits}f} ms"

    spec: list[tuple[str, Callable[[dict], str], str]] = [
        (f"build of wiki-default from the shipped embeddings ({runs[0]['build']['passages']:,} passages)",
         lambda r: f"{r['build']['cached_build_total_s']:.1f} s ({r['build']['cached_build_passages_per_s']:,.0f} passages/s)", ""),
        ("live encoding, all-MiniLM-L6-v2 on CPU",
         lambda r: f"{r['build']['live_encoding_passages_per_s']:.0f} passages/s (≈ {r['build']['estimated_live_build_s'] / 60:.0f} min for wiki-default)", ""),
        ("end-to-end latency, one query in-process, hybrid (default)", lambda r: lat(r, "end_to_end_hybrid"),
         f"p50 ≤ 20 ms {_met(runs, 'end_to_end_p50_ms<=20')}"),
        ("end-to-end latency, dense", lambda r: lat(r, "end_to_end_dense"), ""),
        ("end-to-end latency, BM25", lambda r: lat(r, "end_to_end_bm25", 2), ""),
        ("search only, p50: Flat / HNSW32 (efSearch 64) / BM25",
         lambda r: " / ".join(f"{r['latency'][k]['p50_ms']:.2f}" for k in
                              ("search_only_dense_flat", "search_only_dense_hnsw32_ef64", "search_only_bm25")) + " ms", ""),
        ("in-process hybrid search of 64 queries at once",
         lambda r: f"{r['latency']['batched_64_hybrid_queries_per_s']:.0f} queries/s", ""),
    ]
    for clients in (1, 16, 64):
        def cell(r: dict, c: int = clients) -> str:
            x = level(r, c)
            s = f"{x['throughput_rps']:.1f} req/s, p50 {x['latency_p50_ms']:.1f} ms, {x['errors']} errors"
            return s + (f", {x['speedup_vs_1_client']:.2f}× one client" if c > 1 else "")
        target = ""
        if clients == 64:
            target = f"0 errors {_met(runs, '64_clients_0_errors')}; ≥ 4× {_met(runs, '64_clients>=4x_single')}"
        spec.append((f"HTTP `{runs[0]['http']['endpoint']}`, {clients} client{'s' if clients > 1 else ''}", cell, target))
    spec.append(("ANN recall@10, HNSW32 vs exact Flat",
                 lambda r: ", ".join(f"efSearch {k.split('=')[1]}: {v:.3f}"
                                     for k, v in r["ann_recall@10_hnsw32_vs_flat"].items()),
                 f"≥ 0.98 at efSearch 64 (the default) {_met(runs, 'ann_recall@10>=0.98 (efSearch=64)')}"))
    header = ["what", *(f"{title} ({r['started'][:10]}, load {r['load_avg_1_5_15_at_start'][0]:.1f})"
                        for (_, title), r in zip(BENCH_SEARCH_RUNS, runs)), "target"]
    rows = [[what, *(fn(r) for r in runs), target] for what, fn, target in spec]
    machine = runs[0]["machine"]
    note = (f"{machine['cpus']} CPU cores, no GPU; load average (1 min) at the start of each run in the header. "
            f"JSON: {', '.join(f'`{f}`' for f, _ in BENCH_SEARCH_RUNS)}.")
    return _table(header, rows) + "\n\n" + note


def retrieval() -> str:
    runs = [_load(f) for f, _ in BENCH_SEARCH_RUNS]
    r0 = runs[0]["retrieval"]
    # Retrieval is deterministic: every run must agree, or the table would hide a change.
    for f, r in zip(BENCH_SEARCH_RUNS, runs):
        if r["retrieval"] != r0:
            raise SystemExit(f"{f[0]}: retrieval figures differ from {BENCH_SEARCH_RUNS[0][0]}")
    best = r0["best_method_by_recall@10"]
    names = {"dense": "dense (MiniLM, Flat)", "bm25": "BM25", "hybrid": "hybrid (RRF)"}
    sets = [s for s in r0 if isinstance(r0[s], dict) and isinstance(r0[s].get("dense"), dict)]
    rows = []
    for method in ("dense", "bm25", "hybrid"):
        cells = [names[method]]
        for s in sets:
            v = r0[s][method]
            cells.append(f"{v['recall@5']:.3f} / {v['recall@10']:.3f} / {v['ndcg@10']:.3f}")
        cells.append(f"{r0['mean_recall@10'][method]:.3f}")
        rows.append([f"**{c}**" for c in cells] if method == best else cells)
    label = {"hotpotqa": "HotpotQA", "musique": "MuSiQue"}
    header = ["method", *(f"{label.get(s, s)} R@5 / R@10 / nDCG@10 ({r0[s][best]['n_questions']} questions)" for s in sets),
              "mean R@10"]
    return _table(header, rows)


# -- training benchmark -----------------------------------------------------------------

# (JSON file, description); one row each.
BENCH_TRAIN_ROWS: list[tuple[str, str]] = [
    ("training/results/bench_train_kv_reuse.json", "idle machine, KV cache kept between turns"),
    ("training/results/bench_train_idle.json", "idle machine, every turn re-encoded"),
    ("training/results/bench_train.json", "loaded machine, every turn re-encoded"),
]


def bench_train() -> str:
    rows = []
    for f, desc in BENCH_TRAIN_ROWS:
        d = _load(f)
        mt, st = d["multi_turn"], d["single_turn"]
        ratio = d["ratio_multi_over_single"]
        r = f"{ratio:.2f}"
        rows.append([
            f"{desc}, {d['steps']} steps each (`{Path(f).name}`)", f"{d['load_avg_1m_at_end']:.1f}",
            f"{mt['median_step_s']:.1f} s", f"{mt['median_generation_s']:.1f}", f"{mt['median_env_s']:.3f}",
            f"{mt['median_reward_s']:.3f}", f"{mt['median_optimisation_s']:.1f}", f"{st['median_step_s']:.1f} s",
            f"**{r}**" if ratio <= d["target_ratio"] else r,
        ])
    target = _load(BENCH_TRAIN_ROWS[0][0])["target_ratio"]
    header = ["run", "load (1 min, at end)", "multi-turn step (median)", "generation", "env/search", "reward",
              "optimisation", "single-turn step", f"ratio (target ≤ {target:g})"]
    note = f"JSON in `{Path(BENCH_TRAIN_ROWS[0][0]).parent}/` (`python scripts/bench_train.py`)."
    return _table(header, rows) + "\n\n" + note


# -- the main job under load ---------------------------------------------------------------

# (result of python scripts/bench_rollout.py --background-load 2 ..., what the machine was doing)
MAIN_JOB_LOAD_RUNS: list[tuple[str, str]] = [
    ("scripts/results/bench_rollout_load_demo.json",
     "the main job as it is now (hf:smollm2-drgym on synth-demo); a training run and a preflight paused"),
    ("scripts/results/bench_rollout_load_quiet.json",
     "a GRPO training run (1 thread) beside it, and a pip install during the first rep"),
    ("scripts/results/bench_rollout_load.json", "a shared machine, other users' jobs beside it"),
    ("scripts/results/bench_rollout_load_before_after.json", "a shared machine, other users' jobs beside it"),
    ("scripts/results/bench_rollout_load_torch_neighbours.json", "a shared machine, other users' jobs beside it"),
]

# The "threads" column: the files' code key "current" is drgym as it is; "before" is the same
# commands run from a checkout without drgym's thread settings (bench_rollout.py --before-src).
THREAD_SETTINGS = {
    "current": "drgym's (passive OpenMP waits, threads from the usable cores)",
    "before": "the libraries' defaults (spinning OpenMP waits)",
}


def main_job_load() -> str:
    rows = []
    for rel, beside in MAIN_JOB_LOAD_RUNS:
        r = _load(rel)
        busy = "2 busy torch processes (2 threads each)" if "torch" in r["background_load"] else "2 busy Python loops"
        load = f"{r['load_avg_1_5_15_at_start'][0]:.1f} to {r['load_avg_1_5_15_at_end'][0]:.1f}"
        med = r["median"] if "s_per_episode" not in r["median"] else {"current": r["median"]}  # older files: one code
        for code, m in med.items():
            s, w = m["s_per_episode"], m["command_wall_s"]
            if code not in THREAD_SETTINGS:
                raise SystemExit(f"{rel}: unknown code {code!r} in 'median' (known: {', '.join(THREAD_SETTINGS)})")
            label = THREAD_SETTINGS[code]
            rows.append([f"{r['started'][:16].replace('T', ' ')}, n={r['runs'][0]['episodes']}, {r['reps']} rep(s)",
                         f"{beside}; load {load}", label, busy, f"{s['idle']:.2f}", f"{s['loaded']:.2f}",
                         f"{s['loaded_over_idle']:.2f}×", f"{w['loaded_over_idle']:.2f}×"])
    header = ["run", "machine as it is (1-min load, start to end)", "threads", "background load", "s / episode, as it is",
              "s / episode, + background", "ratio", "ratio of the whole command"]
    return _table(header, rows) + ("\n\nMedians over the reps of one run each; 'as it is' and '+ background' alternate in "
                                   "the same run. Figures from the JSON files named in `scripts/readme_tables.py` "
                                   "(MAIN_JOB_LOAD_RUNS).")


# One column group per run of python scripts/bench_search.py --background-load 2 ..., in this order.
SERVER_LOAD_RUNS: list[str] = [
    "scripts/results/bench_search_load_quiet.json",
    "scripts/results/bench_search_load.json",
]


# Cell names as the JSON spells them (scripts/bench_search.py) -> as the table shows them.
SERVER_LOAD_CELL_WORDS: list[tuple[str, str]] = [
    ("README method: ", ""),
    (", README pool", ", short-query pool"),
    (", before", ", the libraries' default threads"),
]
# A command's local paths -> the option's metavar (scripts/bench_search.py --help).
SERVER_LOAD_COMMAND_PATHS: list[tuple[str, str]] = [
    (r"--before-src \S+", "--before-src DIR"),
    (r"--search-r1 \S+", "--search-r1 RETRIEVAL_SERVER_PY"),
    (r"--work \S+", "--work WORK"),
]


def _cell_label(cell: str) -> str:
    for old, new in SERVER_LOAD_CELL_WORDS:
        cell = cell.replace(old, new)
    return cell


def _command(cmd: str) -> str:
    for pat, new in SERVER_LOAD_COMMAND_PATHS:
        cmd = re.sub(pat, new, cmd)
    return cmd


def server_load() -> str:
    runs = [(rel, _load(rel)) for rel in SERVER_LOAD_RUNS if (REPO / rel).is_file()]
    cells = list(dict.fromkeys(c for _, r in runs for c in r["median_rps"]))
    header = ["load generator, request, clients (cell)"]
    for k, (_, r) in enumerate(runs, 1):
        header += [f"run {k}: req/s as it is", f"run {k}: req/s + 2 busy", f"run {k}: server CPU ms / req"]
    rows = []
    for cell in cells:
        row = [_cell_label(cell)]
        for _, r in runs:
            m = r["median_rps"].get(cell)
            row += ([f"{m['idle']:.1f}", f"{m['loaded']:.1f}", f"{m['server_cpu_ms_per_request']:.1f}"] if m
                    else ["-", "-", "-"])
        rows.append(row)
    notes = [f"Run {k}: `{_command(r['command'])}`, {r['started'][:16].replace('T', ' ')} UTC, medians of {r['reps']} passes of "
             f"{r['seconds_per_cell']:.0f} s per cell; 1-minute load {r['load_avg_1_5_15_at_start'][0]:.1f} at the "
             f"start, {r['load_avg_1_5_15_at_end'][0]:.1f} at the end (`{rel}`)."
             for k, (rel, r) in enumerate(runs, 1)]
    return _table(header, rows) + "\n\n" + "\n".join(notes) + (
        " 'The libraries' default threads': the same server from a checkout without drgym's thread settings "
        "(`--before-src DIR`: spinning OpenMP waits); 'short-query pool': the search benchmark's queries, k=10; "
        "`--search-r1`: Search-R1's own `retrieval_server.py` over the same index.")


SEARCH_R1_SIDE_BY_SIDE = "scripts/results/bench_search_sr1_rescore.json"  # bench_search.py --search-r1 ... --search-r1-only


def search_r1_side_by_side() -> str:
    """drgym serve (dense; torch, ONNX and int8 ONNX query encoders; int8 also on all threads) and
    Search-R1's retrieval_server.py on the same work, at 1, 16 and 64 clients: server CPU per
    request, its ratio, and req/s."""
    r = _load(SEARCH_R1_SIDE_BY_SIDE)
    med = r["median_rps"]
    servers = [("drgym serve --method dense", "drgym --method dense"),
               ("drgym serve --method dense --encoder-backend onnx", "drgym --method dense --encoder-backend onnx"),
               ("drgym serve --method dense --encoder-backend onnx-int8", "drgym --method dense --encoder-backend onnx-int8"),
               ("drgym serve --method dense --encoder-backend onnx-int8 --search-threads 0",
                "drgym --method dense --encoder-backend onnx-int8 --search-threads 0"),
               ("Search-R1 retrieval_server.py", "Search-R1 retrieval_server.py")]
    servers = [s for s in servers if any(c.endswith(s[1]) for c in med)]  # runs before --search-threads lack that row

    def cell(clients: int, key: str):
        return next((m for c, m in med.items() if f", {clients} clients, " in c and c.endswith(key)), None)

    rows = []
    for label, key in servers:
        row = [label]
        for clients in (1, 16, 64):
            m, sr1 = cell(clients, key), cell(clients, "Search-R1 retrieval_server.py")
            ratio = sr1["server_cpu_ms_per_request"] / m["server_cpu_ms_per_request"] if m and sr1 else None
            row += [f"{m['server_cpu_ms_per_request']:.1f}" + (f" ({ratio:.1f}x less)" if ratio and key != servers[-1][1] else ""),
                    f"{m['idle']:.1f} / {m['loaded']:.1f}"]
        rows.append(row)
    head = ["server"] + [c for n in (1, 16, 64) for c in (f"CPU ms / request, {n} client{'s' if n > 1 else ''}",
                                                          f"req/s as it is / + 2 busy, {n}")]
    errors = {label: sum(c.get("errors", 0) for p in r["passes"] for c in p["cells"] if c["cell"].endswith(key))
              for label, key in servers}
    errs = "errors: " + ", ".join(f"{n} ({label})" for label, n in errors.items())
    version = _search_r1_version(r)
    return _table(head, rows) + (
        f"\n\nPOST /retrieve, one real question per request, topk 5, dense Flat over the same passages, FAISS file and "
        f"MiniLM on every server{version}; Python load generator; medians of {r['reps']} passes of {r['seconds_per_cell']:.0f} s "
        f"per cell, on the machine as it is and with 2 busy processes; {errs}. One run, "
        f"{r['started'][:16].replace('T', ' ')} UTC, 1-minute load {r['load_avg_1_5_15_at_start'][0]:.1f} at the start and "
        f"{r['load_avg_1_5_15_at_end'][0]:.1f} at the end (the load generator and the busy processes of the loaded "
        f"passes count in it), on 2 cores. "
        f"`{_command(r['command'])}` (`{SEARCH_R1_SIDE_BY_SIDE}`).")


def mmap_memory() -> str:
    """Private memory of loading an index read against memory-mapped (scripts/bench_mmap.py)."""
    d = _load("scripts/results/bench_mmap.json")
    rows = [[f"`{r['factory']}`, {r['n']:,} random {r['dim']}-d vectors ({r['file_mib']:.1f} MiB)",
             f"{r['read_anon_growth_mib']:.1f} MiB", f"{r['mmap_anon_growth_mib']:.1f} MiB",
             "yes" if r["same_top10"] else "**no**"] for r in d["indexes"]]
    return _table(["index file", "read", "memory-mapped", "same top 10"], rows) + (
        f"\n\nGrowth of a fresh process's private memory (RssAnon) across loading and one search; faiss "
        f"{d['faiss']}, {d['started'][:10]}. `{d['command']}`.")


def _script(name: str):
    """``scripts/<name>.py`` as a module (the renderers of bench_scale and eval_table live there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- scale ------------------------------------------------------------------------------

SCALE = "scripts/results/bench_scale_fastscan.json"  # python scripts/bench_scale.py ... --out (this file)
PQ_CODES = "scripts/results/bench_pq_codes.json"  # python scripts/bench_pq_codes.py


SCALE_WIKI18 = "scripts/results/bench_scale_wiki18.json"  # bench_scale.py --sizes 21015324 ... (a run of its own)


def _scale_runs() -> list[tuple[str, dict]]:
    """The scale runs whose sizes the tables show: 10^5-5x10^6 in one run, and the wiki-18
    size (2.1x10^7) in a run of its own, once its import has finished."""
    runs = [(SCALE, _load(SCALE))]
    if (REPO / SCALE_WIKI18).is_file():
        w = _load(SCALE_WIKI18)
        if any("import" in r and "error" not in r["import"] for r in w["sizes"].values()):
            runs.append((SCALE_WIKI18, w))
    return runs


def _scale_merged() -> dict:
    """One result with the sizes of every run of :func:`_scale_runs` (same dim and settings
    of the generated data; the runs' commands are in the captions)."""
    runs = _scale_runs()
    merged = dict(runs[0][1])
    merged["sizes"] = {k: v for _, r in runs for k, v in r["sizes"].items()}
    return merged


def scale() -> str:
    lines = []
    for rel, r in _scale_runs():
        m = r["machine"]
        status = "" if r.get("finished") else " (not finished: its stages so far)"
        lines.append(f"`{_command(r['command']).split(' --work')[0]}`{status}, started "
                     f"{r['started'][:16].replace('T', ' ')}, on {m['affinity']} cores and {m['ram_gb']:.0f} GB "
                     f"(faiss {m['faiss']}); the load average of each stage is in `{rel}`.")
    return _script("bench_scale").table(_scale_merged()).rstrip("\n") + "\n\n" + "\n".join(
        ("- " + x if len(lines) > 1 else x) for x in lines)


def scale_paper() -> str:
    return _script("bench_scale").paper(_load(SCALE)).rstrip("\n")


def sizing() -> str:
    r = _scale_merged()
    src = " and ".join(f"`{rel}` (`python scripts/bench_scale.py --sizing {rel}`)" for rel, _ in _scale_runs())
    return _script("bench_scale").sizing(r).rstrip("\n") + (
        f"\n\nFrom {src}: bytes on disk and seconds per 10^6 "
        "passages at each measured size, peaks for the whole index; wiki-18 scaled linearly from the largest size, "
        "vector terms doubled for 768-d. Times are wall-clock on the benchmark machine (one FAISS thread, load in the "
        "JSON); private memory is RssAnon sampled every 0.2 s (\"-\": not sampled in that stage).")


SCALE_SHARDS = "scripts/results/bench_scale_5m_shards.json"  # bench_scale.py --sizes 5000000 ... --flat-max 0


def scale_shards() -> str:
    """IVF-PQ at 5x10^6 (two shards): shards searched side by side (the default) and in turn."""
    r = _load(SCALE_SHARDS)
    (n, size), = r["sizes"].items()
    rows = []
    for label in ("IVF-PQ", "IVF-PQ shards in turn", "IVF-PQ nprobe 16", "IVF-PQ rerank 0"):
        x = size["search"].get(label)
        if not x or "error" in x:
            continue
        p = x["params"]
        rows.append([f"{x['factory']}", str(x["shards"]), str(x["shard_workers"]),
                     str(p["nprobe"] or "auto"), str(p["rerank"]), f"{x['single_ms_p50']:.1f} / {x['single_ms_p99']:.1f}",
                     f"{x['batch64_ms_p50']:.1f}", f"{x['recall@10']:.3f}", f"{x['load_avg'][0]:.1f}" if "load_avg" in x else "-"])
    return _table(["index", "shards", "shard threads", "nprobe", "re-rank (a shard)", "1 query p50 / p99 ms", "64 queries p50 ms",
                   "recall@10", "load (1 min)"], rows) + (
        f"\n\n{int(n):,} synthetic 384-d vectors, 200 queries, recall@10 against exact search; one FAISS thread per "
        f"shard call (OMP_NUM_THREADS=1); shard threads 2: the two shards searched side by side, 1: in turn; the "
        f"GRPO run that shares this machine was paused during the search stages. Started "
        f"{r['started'][:16].replace('T', ' ')}, 2 cores, when each shard re-ranked `rerank` candidates (now they are "
        f"split between the shards). `{r['command'].split(' --work')[0]}` (`{SCALE_SHARDS}`).")


def pq_codes() -> str:
    d = _load(PQ_CODES)
    rows = []
    for fac, f in d["factories"].items():
        for s in f["search"].values():
            rows.append([fac, str(s["nprobe"]), str(s["rerank"]), f"{s['recall@10']:.3f}", f"{s['single_ms_p50']:.1f}",
                         f"{f['build_s']:.0f}", f"{f['bytes_per_vector']:.0f}"])
    loads = sorted({f["load_avg"][0] for f in d["factories"].values()})
    return _table(["index", "nprobe", "re-rank", "recall@10", "1 query p50 ms", "build s", "bytes / vector"], rows) + (
        f"\n\n{d['n']:,} synthetic {d['dim']}-d vectors (bench_scale's recipe), {d['queries']} queries, recall@10 "
        f"against exact search after the exact re-rank; one FAISS thread (OMP_NUM_THREADS="
        f"{d['machine']['omp_num_threads']}), both factories in one run, {d['started'][:10]}, on "
        f"{d['machine']['cpus']} cores shared with other CPU-bound jobs (load {loads[0]}-{loads[-1]}), so the "
        f"latencies are high; their ratio is the figure. `{d['command']}`.")


# -- the bundled agent's test-slice table ---------------------------------------------------

TEST_TABLE = "training/results/test_table.json"  # python scripts/eval_table.py ...


def test_table() -> str:
    t = _load(TEST_TABLE)
    return _script("eval_table").markdown(t).rstrip("\n") + f"\n\n`{t['made_by']}`; env: {t['env']}."


BENCH_TRAIN_LORA = "training/results/bench_train_lora.json"  # python scripts/bench_train.py --vs-full ...


def bench_train_lora() -> str:
    r = _load(BENCH_TRAIN_LORA)
    o, g = r["optimisation"], r["generation_one_turn"]
    labels = {"lora": f"LoRA r={r['peft']['r']} on the top {len(r['peft'].get('layers_to_transform') or [])} layers "
                      "(the config)", "full": "full fine-tuning", "top10": "top 10 decoder layers, no adapter"}
    rows = [[labels[k], f"{v['trainable_params'] / 1e6:.2f} M", f"{v['median_optimisation_s']:.1f}",
             f"{v['median_optimisation_s'] / o['full']['median_optimisation_s']:.2f}×"] for k, v in o.items()]
    b = r["batch"]
    return _table(["what trains", "trainable parameters", "GRPO optimisation of the batch (s, median of "
                   f"{r['repeats']})", "vs full"], rows) + (
        f"\n\nOne GRPO batch of the config ({b['rows']} rollouts, {b['prompt_tokens']} prompt and "
        f"{b['completion_tokens']} completion tokens, {b['loss_tokens (model, env_mask=1)']} in the loss): TRL's "
        f"GRPO loss, backward and AdamW step, on {r['torch_threads']} thread, 1-minute load "
        f"{r['load_avg_1m_at_start_end'][0]:.1f} to {r['load_avg_1m_at_start_end'][1]:.1f}. Generating one turn "
        f"with the adapter unmerged (as GRPO does) took {g['lora_unmerged']['median_generation_s']:.1f} s against "
        f"{g['plain']['median_generation_s']:.1f} s for the plain model. `{BENCH_TRAIN_LORA}`.")


GRPO_SUMMARY = "training/results/smollm2_drgym_cpu/grpo_summary.json"  # python scripts/summarize_grpo.py ...


def grpo_summary() -> str:
    r = _load(GRPO_SUMMARY)
    cols = [("steps", "steps", "{}"), ("reward", "train reward", "{:.3f}"), ("reward_std", "reward std in batch", "{:.3f}"),
            ("f1", "train F1 (T=1)", "{:.3f}"), ("degenerate_group_frac", "zero-variance groups", "{:.2f}"),
            ("answered_frac", "answered", "{:.2f}"), ("invalid_actions", "invalid actions / ep", "{:.2f}"),
            ("entropy", "entropy", "{:.2f}"), ("model_tokens", "model tokens / ep", "{:.0f}"), ("step_s", "s / step", "{:.0f}")]
    rows = [[fmt.format(w[k]) for k, _, fmt in cols] for w in r["windows"]]
    evals = ", ".join(f"step {e['step']}: {e['f1']:.3f}" for e in r["evaluations"])
    return _table([c[1] for c in cols], rows) + (
        f"\n\nHeld-out F1 (greedy, `hipporag-dev`, 20 questions) at each evaluation: {evals}. "
        f"`{GRPO_SUMMARY}` (`python scripts/summarize_grpo.py RUN --out ...`).")


ANSWERABLE_POOL = "training/results/answerable_pool/pool_record.json"  # python scripts/make_answerable_pool.py
ANSWERABLE_RUN = "training/results/smollm2_answerable_cpu/grpo_summary.json"  # python scripts/long_run.py ...
ANSWERABLE_TABLE = "training/results/answerable_test_table.json"  # python scripts/eval_table.py --start ...
ANSWERABLE_CONTROL = "training/results/answerable_train_control.json"  # python scripts/eval_table.py --tasks answerable-train
ANSWERABLE_HIPPO = "training/results/answerable_hipporag_test_table.json"  # ... --tasks hipporag-test
TWO_HOP_TEST = "training/results/two_hop_hipporag_test_table.json"  # ... --trained-label "start + two-hop SFT"
EVIDENCE_RUN = "training/results/smollm2_answerable_evidence_cpu/grpo_summary.json"  # long_run.py --config ..._evidence_cpu
EVIDENCE_TEST = "training/results/evidence_test_table.json"  # eval_table.py ... --trained-label "start + GRPO (evidence)"
EVIDENCE_HIPPO = "training/results/evidence_hipporag_test_table.json"  # ... --tasks hipporag-test


def answerable_pool() -> str:
    r = _load(ANSWERABLE_POOL)
    names = {"hipporag-train": "HippoRAG train slice", "nq-open-full": "NQ-open dev", "efficientqa-dev": "EfficientQA dev",
             "efficientqa-test": "EfficientQA test", "deepresearcher-dev": "DeepResearcher dev mix",
             "deepresearcher-test": "DeepResearcher test mix"}
    rows = []
    for src, st in r["stages"].items():
        sp = {k: r["split_by_source"][k].get(src, 0) for k in ("train", "dev", "test")}
        rows.append([names.get(src, src), f"{st['n']:,}", f"{st['yes_no_only'] + st['gold_in_question'] + st['duplicate_or_held_out']:,}",
                     f"{st['obs_hit']:,}", f"{st['full10_not_obs']:,}", str(sp["train"]), str(sp["dev"]), str(sp["test"])])
    tot = {k: sum(v for v in r["split_by_source"][k].values()) for k in ("train", "dev", "test")}
    rows.append(["**all**", f"{sum(s['n'] for s in r['stages'].values()):,}", "", f"**{r['answerable']}**",
                 f"{r['search_skill']}", str(tot["train"]), str(tot["dev"]), str(tot["test"])])
    return _table(["source", "questions", "dropped (yes/no, gold in question, duplicate or held out)",
                   "answerable (gold in the observation)", "search skill (top-10, not top-3 observation)",
                   "train", "dev", "test"], rows) + (
        f"\n\n`{r['command']}` ({r['seconds']:.0f} s); the env: {r['settings']['search']}, "
        f"{r['settings']['env']['kwargs']}. `{ANSWERABLE_POOL}`.")


def answerable_run(path: str = ANSWERABLE_RUN) -> str:
    r = _load(path)
    cols = [("steps", "steps", "{}"), ("f1", "train F1 (T=1)", "{:.3f}"), ("format", "format penalty", "{:+.3f}"),
            ("filtered_frac", "zero-variance groups", "{:.2f}"), ("entropy", "entropy", "{:.2f}"),
            ("lr_scale", "brake lr scale", "{:.2f}"), ("invalid_actions", "invalid actions / ep", "{:.2f}"),
            ("searches", "searches / ep", "{:.2f}"), ("model_tokens", "model tokens / ep", "{:.0f}"),
            ("step_s", "s / step", "{:.0f}")]
    rows = [[fmt.format(w[k]) if w.get(k) is not None else "" for k, _, fmt in cols] for w in r["windows"]]
    evals = ", ".join(f"step {e['step']}: {e['f1']:.3f}" for e in r["evaluations"])
    return _table([c[1] for c in cols], rows) + (
        f"\n\n{r['steps']} steps{'' if _run_finished(r) else ' so far'}. Dev F1 (greedy, `answerable-dev`, 30 questions) at each evaluation: "
        f"{evals}. `{path}` ({r['made_by']}).")


def _run_finished(summary: dict) -> bool:
    """The run of a ``summarize_grpo.py`` summary reached its config's ``max_steps``."""
    from drgym.training.config import load_config

    return summary["steps"] >= int(load_config(summary["run"]).grpo.get("max_steps") or 0) > 0


def evidence_run() -> str:
    return answerable_run(EVIDENCE_RUN)


def _eval_table(path: str, why_missing: str = "") -> str:
    """An ``eval_table.py`` table JSON as markdown with the command that made it, or a
    "not measured yet" line when ``path`` does not exist."""
    if not (REPO / path).is_file():
        return f"Not measured yet (`{path}` does not exist){why_missing}."
    t = _load(path)
    return _script("eval_table").markdown(t).rstrip("\n") + f"\n\n`{t['made_by']}`; env: {t['env']}."


def answerable_table() -> str:
    return _eval_table(ANSWERABLE_TABLE)


def answerable_hipporag() -> str:
    return _eval_table(ANSWERABLE_HIPPO)


def two_hop_test() -> str:
    return _eval_table(TWO_HOP_TEST)


def evidence_test() -> str:
    return _eval_table(EVIDENCE_TEST)


def evidence_hipporag() -> str:
    return _eval_table(EVIDENCE_HIPPO)


def answerable_control() -> str:
    return _eval_table(ANSWERABLE_CONTROL, ": it needs a checkpoint that has trained long enough to be worth the "
                                           "190-question evaluation")


def policy_options() -> str:
    """Every policy kind's ``-p KEY=VALUE`` options, read from the constructors (never typed)."""
    import inspect

    from drgym.policies.factory import RAG_OPTIONS
    from drgym.policies.hf import HFPolicy
    from drgym.policies.openai import OpenAIPolicy
    from drgym.policies.scripted import ScriptedPolicy
    from drgym.policies.vllm import VLLMPolicy

    def opts(cls) -> str:
        skip = {"self", "model", "args", "kwargs", "base_url"}
        return ", ".join(f"`{p}`" for p in inspect.signature(cls.__init__).parameters if p not in skip)

    rows = [["`hf:MODEL`", opts(HFPolicy)], ["`openai:MODEL@URL`", opts(OpenAIPolicy)],
            ["`vllm:MODEL`", opts(VLLMPolicy)],
            ["`rag:LLM`", ", ".join(f"`{o}`" for o in RAG_OPTIONS) + "; any other option goes to the reader LLM"],
            ["`rtr:AGENT`", "the agent LM's options"], ["`scripted`", opts(ScriptedPolicy)]]
    return _table(["policy", "options (`-p KEY=VALUE`)"], rows) + (
        "\n\nRead from the policies' constructors by `scripts/readme_tables.py`; each option's meaning is in "
        "the class's docstring (API reference).")


def bm25_engines() -> str:
    d = _load("scripts/results/bench_bm25_engines.json")
    rows = []
    for name, c in d["corpora"].items():
        a = c["agreement"]
        for eng in [e for e in ("bm25s", "bm25s-streaming", "fts5") if e in c["engines"]]:
            e = c["engines"][eng]
            rows.append([f"{name} ({c['passages']:,} passages)", eng, f"{e['build_s']:.1f}", f"{e['build_rss_added_mb']:.0f}",
                         f"{e['index_bytes'] / 2**20:.0f}", f"{e['query_p50_ms']:.2f}", f"{e['query_p90_ms']:.2f}",
                         f"{a['overlap_at_10_mean']:.2f} / {a['top1_same']:.2f}" if eng == "fts5" else
                         ("1.00 / 1.00 (same rankings)" if c.get("streaming_same_rankings_as_bm25s") else "differs!")
                         if eng == "bm25s-streaming" else "-"])
    head = ["corpus", "engine", "build s", "build memory MB", "index MB", "query p50 ms", "query p90 ms",
            "overlap@10 / top-1 with bm25s"]
    load = d["load_avg_1_5_15_at_start"][0]
    return (_table(head, rows) + f"\n\nOne run, {d['started'][:10]}, {d['cpu_count']} cores, load {load:.1f} at the start; "
            "build memory: the building process's peak resident memory above its size before the build (VmHWM); "
            f"queries one at a time on one thread ({next(iter(d['corpora'].values()))['queries']} per corpus). "
            f"`{d['command']}`.")


def search_profile() -> str:
    d = _load("scripts/results/bench_search_profile.json")
    labels = {"http_parse": "HTTP/1.1 parsing and response head (h11)", "validation": "body checks (non-finite, pydantic)",
              "tokenize": "query tokenisation", "encoder_forward": "MiniLM forward", "faiss": "FAISS (Flat)",
              "bm25": "BM25 (bm25s)", "fusion": "rank fusion", "ranking_other": "rest of ranking (encode call, arrays)",
              "docstore_collapse": "docstore reads and collapse", "serialize_response": "response model and JSON (pydantic-core)",
              "json_encode": "further JSON encoding", "framework_other": "FastAPI, asyncio, micro-batcher (the rest)"}
    by = d.get("by_encoder_backend") or {"torch": d}
    backends = [b for b in ("torch", "onnx") if b in by]
    totals = {b: by[b]["cpu_ms_per_request_total_with_http_parse"] for b in backends}
    rows = []
    for k in d["cpu_ms_per_request"]:
        row = [labels[k]]
        for b in backends:
            v = by[b]["cpu_ms_per_request"][k]
            row += [f"{v:.2f}", _pct(v / totals[b])]
        rows.append(row)
    rows.append(["**total**"] + [c for b in backends for c in (f"**{totals[b]:.2f}**", "100 %")])
    rows.append(["floor: the encoder's forward alone, 64 queries a call"]
                + [c for b in backends for c in (f"{by[b]['encoder_forward_floor_ms_per_query_batched_64']:.2f}", "-")])
    head = ["stage"] + [c for b in backends for c in (f"CPU ms / request, {b} encoder", "share")]
    text = _table(head, rows)
    text += (f"\n\n{d['request']}; {d['requests']} requests per pass, medians of {d.get('passes_per_backend', 1)} passes "
             f"per encoder run in turns, one torch thread, load {d['load_avg_1_5_15'][0]:.1f} on {d['cpus']} cores, "
             f"{d['started'][:10]}. `{d['command']}`.")
    ag = d.get("onnx_encoder_agreement")
    if ag:
        rec = ag["supporting_paragraph_recall@10"]
        arows = [["ONNX Runtime (float32, same weights)", f"{d['onnx_over_torch_cpu_per_request']:.2f}x",
                  f"{ag['query_vector_cosine_min']:.7f}", f"{ag['dense']['overlap_at_10']:.3f}",
                  f"{ag['hybrid']['overlap_at_10']:.3f}",
                  " / ".join(f"{rec[n]['onnx'] - rec[n]['torch']:+.3f}" for n in ("hotpotqa", "musique"))]]
        q8 = d.get("int8_dynamic_query_encoder")
        if q8:
            arows.append(["torch int8 dynamic quantisation", f"{q8['encode_ms_per_query_int8'] / q8['encode_ms_per_query_fp32']:.2f}x "
                          "(encoding only)", f"{q8['query_vector_cosine_mean']:.2f} (mean)", f"{q8['dense_overlap_at_10']:.3f}",
                          "-", "not measured"])
        text += "\n\n" + _table(["query encoder against torch float32", "CPU per request", "query-vector cosine (min)",
                                  "dense top-10 overlap", "hybrid top-10 overlap", "dense recall@10 change, HotpotQA / MuSiQue"],
                                 arows)
        text += (f"\n\nOverlap over {ag['questions']} real questions (NQ-open, HotpotQA, MuSiQue, SimpleQA, FRAMES); "
                 "recall@10 of the HippoRAG supporting paragraphs (79 HotpotQA, 80 MuSiQue questions), documents collapsed.")
    return text


PEER_DEFAULT = "scripts/results/bench_search_peer_default.json"  # bench_search.py --peer-default --search-r1 ...
PROFILE_DEFAULT = "scripts/results/bench_search_profile_default.json"  # bench_search.py --profile-default 300


def peer_default() -> str:
    """drgym serve at its default settings against Search-R1's retrieval_server.py, at 1, 16
    and 64 clients, round by round (A B A B): server CPU per request, their ratio, req/s, and
    the floor (the default query encoder's forward alone, per query)."""
    r = _load(PEER_DEFAULT)
    floor = r["floor_encoder_cpu_ms_per_query"]
    rows = []
    for clients, m in r["summary"].items():
        rows.append([clients,
                     " / ".join(f"{x:.2f}" for x in m["drgym_cpu_ms_per_request"]),
                     " / ".join(f"{x:.1f}" for x in m["search_r1_cpu_ms_per_request"]),
                     " / ".join(f"{x:.1f}x" for x in m["cpu_ratio_search_r1_over_drgym_by_round"]),
                     " / ".join(f"{x:.1f}" for x in m["drgym_rps"]),
                     " / ".join(f"{x:.1f}" for x in m["search_r1_rps"]),
                     f"{floor['batched_64']['forward']:.2f} / {floor['one_query']['forward']:.2f}",
                     "yes" if m["target_tenth_met_every_round"] else "no"])
    head = ["clients", "drgym serve: CPU ms / request, round 1 / 2", "Search-R1: CPU ms / request, round 1 / 2",
            "Search-R1 / drgym CPU", "drgym req/s", "Search-R1 req/s",
            "floor: encoder forward CPU ms / query, 64 a call / 1 a call", "drgym <= 1/10 of Search-R1's CPU"]
    errors = {"drgym": sum(m["errors"]["drgym"] for m in r["summary"].values()),
              "Search-R1": sum(m["errors"]["search-r1"] for m in r["summary"].values())}
    eng = r.get("drgym_engine") or {}
    loads = [c["load_avg_1m_before"] for c in r["cells"]] + [c["load_avg_1m_after"] for c in r["cells"]]
    version = _search_r1_version(r)
    return _table(head, rows) + (
        f"\n\n{r['request']}; drgym serve with its defaults ({eng.get('method')}, `{eng.get('encoder_backend')}` query "
        f"encoder, one search thread) and the result cache off (`--cache-size 0`: the pool's questions repeat within a "
        f"run); Search-R1's `retrieval_server.py`{version} over the same FAISS file and passages, MiniLM in torch float32. "
        f"{r['pool']}; {r['generator']}; {r['seconds_per_cell']:.0f} s per cell, {r['rounds']} rounds, {r['order']}; "
        f"errors: {errors['drgym']} (drgym), {errors['Search-R1']} (Search-R1). CPU: user + system time of each server's "
        f"process (PIDs {r['drgym']['process']['pid']} and {r['search_r1']['process']['pid']}, both children of the "
        f"benchmark, recorded with their command lines) per answered request. The floor: the default query encoder's "
        f"forward pass alone, one thread, in the benchmark's process before the servers start. One run, "
        f"{r['started'][:16].replace('T', ' ')} UTC, on {r['cpu_count']} cores shared with a training run; 1-minute load "
        f"{min(loads):.1f}-{max(loads):.1f} over the cells. `{_command(r['command'])}` (`{PEER_DEFAULT}`).")


def search_profile_default() -> str:
    """Where drgym serve's CPU goes for a default POST /retrieve, stage by stage, at 1, 16
    and 64 requests at a time."""
    d = _load(PROFILE_DEFAULT)
    by = d["by_clients"]
    levels = list(by)
    stages = list(by[levels[0]]["cpu_ms_per_request"])
    rows = []
    for k in stages:
        row = [d["stages"][k]]
        for c in levels:
            v = by[c]["cpu_ms_per_request"][k]
            row += [f"{v:.2f}", _pct(v / by[c]["total_with_http_parse"])]
        rows.append(row)
    rows.append(["**total**"] + [x for c in levels for x in (f"**{by[c]['total_with_http_parse']:.2f}**", "100 %")])
    rows.append(["above the encoder (total less tokenisation and forward)"]
                + [x for c in levels for x in (f"{by[c]['above_encoder']:.2f}", _pct(by[c]["above_encoder"] / by[c]["total_with_http_parse"]))])
    fl = d["floor_encoder_cpu_ms_per_query"]
    rows.append(["floor: the encoder's forward alone, per query (64 a call)"]
                + [x for c in levels for x in (f"{fl['batched_64']['forward']:.2f}", "-")])
    head = ["stage"] + [x for c in levels for x in (f"CPU ms / request, {c} at a time", "share")]
    flat = d["flat_search_paths"]
    frows = [[n, f"{v['loop_cpu_ms_per_call']:.2f}", f"{v['blas_cpu_ms_per_call']:.2f}", v["drgym_path"]]
             for n, v in flat["sizes"].items()]
    ident = d["engine"]["identity"] or {}
    return _table(head, rows) + (
        f"\n\n{d['request']}; {ident.get('method')}, `{ident.get('encoder_backend')}`; {d['requests_per_pass']} requests per "
        f"pass, medians of {d['passes']} passes per level run in turns, on {d['cpus']} cores (1-minute load "
        f"{d['load_avg_1_5_15_at_end'][0]:.1f} at the end). The app is driven in-process through its ASGI interface, "
        f"1, 16 or 64 requests at a time (the micro-batcher groups them); HTTP parsing (h11) and the body checks are "
        f"timed beside it on the same bodies. `{d['command']}` (`{PROFILE_DEFAULT}`).\n\n"
        + _table(["queries a call", "FAISS loop: CPU ms / call", "FAISS BLAS: CPU ms / call", "drgym takes"], frows)
        + f"\n\nFAISS's exact search on the {flat['index']} shard ({flat['vectors']:,} vectors of {flat['dim']} dimensions, "
          f"top {flat['depth']}, one thread), by its per-query loop and through BLAS; drgym's threshold "
          f"(queries x dimension) is {flat['drgym_threshold_queries_x_dim']:,}.")


SEARCH_ENCODERS = "scripts/results/bench_search_profile_int8.json"
# (encoder backend, label, key of its agreement with torch in the JSON, its recall key)
SEARCH_ENCODER_ROWS: list[tuple[str, str, str | None, str]] = [
    ("torch", "torch, float32", None, "torch"),
    ("onnx", "`onnx`: ONNX Runtime, float32", "onnx_encoder_agreement", "onnx"),
    ("onnx-int8", "`onnx-int8`: ONNX Runtime, int8", "onnx_int8_encoder_agreement", "onnx-int8"),
]


def search_encoders() -> str:
    """The query encoders side by side: CPU of the forward alone (one query a call and 64 a
    call) and of a whole request, and their rankings and recall against torch float32."""
    d = _load(SEARCH_ENCODERS)
    cpu, by = d["encoder_cpu_ms_per_query"], d["by_encoder_backend"]
    ref = d["onnx_encoder_agreement"]["supporting_paragraph_recall@10"]
    rows = []
    for backend, label, agree, key in SEARCH_ENCODER_ROWS:
        a = d[agree] if agree else None
        rec = a["supporting_paragraph_recall@10"] if a else ref
        row = [label, f"{cpu[backend]['one_query']['forward']:.2f}", f"{cpu[backend]['batched_64']['forward']:.2f}",
               f"{by[backend]['cpu_ms_per_request_total_with_http_parse']:.2f}"]
        if a is None:
            row += ["1 (reference)"] * 3
        else:
            row += [f"{a['query_vector_cosine_min']:.4f} / {a['query_vector_cosine_mean']:.4f}",
                    f"{a['dense']['overlap_at_10']:.3f} / {a['dense']['top1_same']:.3f}",
                    f"{a['hybrid']['overlap_at_10']:.3f} / {a['hybrid']['top1_same']:.3f}"]
        row += [" / ".join(f"{rec[n][key]:.3f}" for n in ("hotpotqa", "musique")),
                " / ".join(f"{rec[n][f'{key}_hybrid']:.3f}" for n in ("hotpotqa", "musique"))]
        rows.append(row)
    head = ["query encoder", "forward CPU ms / query, 1 a call", "forward CPU ms / query, 64 a call",
            "CPU ms / request", "query-vector cosine to torch, min / mean", "dense top-10 overlap / top-1 with torch",
            "hybrid top-10 overlap / top-1 with torch", "dense recall@10, HotpotQA / MuSiQue",
            "hybrid recall@10, HotpotQA / MuSiQue"]
    q = d["onnx_int8_quantisation"]
    n = d["onnx_int8_encoder_agreement"]["questions"]
    return (_table(head, rows)
            + f"\n\nForward: the query encoder's forward pass alone, one thread, over {d['requests']} real questions, "
            f"medians of 2 passes run in turns; request: one `POST /retrieve` (hybrid, topk 5, cache off) through "
            f"`drgym serve`'s app, as in the table above. Overlap and top-1 (passages) over {n} real questions "
            "(NQ-open, HotpotQA, MuSiQue, SimpleQA, FRAMES); recall@10 of the HippoRAG supporting paragraphs (79 "
            f"HotpotQA, 80 MuSiQue questions), documents collapsed; the index (torch float32 passage vectors) is the "
            f"same for every row. int8: `{q['tool']}` of onnxruntime {q['onnxruntime']}, weights {q['weight_type']} "
            f"per channel, a {q['file_mb']:.0f} MB file against {q['float32_file_mb']:.0f} MB. One run, "
            f"{d['started'][:10]}, load {d['load_avg_1_5_15'][0]:.1f} on {d['cpus']} cores shared with other jobs. "
            f"`{d['command']}`.")


ENCODER_CHOICE = "scripts/results/bench_encoder_choice.json"
ENCODER_CHOICE_LABELS = {"torch": "`torch`, float32", "onnx": "`onnx`: ONNX Runtime, float32",
                         "onnx-int8": "`onnx-int8`: ONNX Runtime, int8"}


def encoder_choice() -> str:
    """The default query encoder's decision (scripts/bench_encoder_choice.py): qrels recall@10
    and nDCG@10, answer recall@5/@20 and agreement with torch for each encoder and method,
    with each change against torch and its paired bootstrap interval."""
    d = _load(ENCODER_CHOICE)
    sets = list(d["answer_sets"])
    names = {"nq-open": "NQ", "hotpotqa-dev": "HotpotQA", "musique-dev": "MuSiQue", "nq-open-full": "NQ (2,819)"}

    def change(c: dict) -> str:
        lo, hi = c["ci95"]
        return f"{c['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]"

    rows = []
    for backend, by in d["by_backend"].items():
        for method, m in by.items():
            row = [ENCODER_CHOICE_LABELS[backend] + (" (default on the CPU)" if backend == d["decision"] else ""),
                   method, f"{m['qrels']['recall@10']:.3f}", f"{m['qrels']['ndcg@10']:.3f}",
                   " / ".join(f"{m['answer_recall'][s]['@5']:.3f}" for s in sets),
                   " / ".join(f"{m['answer_recall'][s]['@20']:.3f}" for s in sets)]
            if "difference_to_torch" in m:
                a, diff = m["agreement_with_torch"], m["difference_to_torch"]
                row += [f"{a['overlap_at_10']:.3f} / {a['top1_same']:.3f}",
                        " / ".join(change(diff["qrels"][k]) for k in ("recall@10", "ndcg@10")),
                        " / ".join(change(diff["answer_recall_all_sets"][k]) for k in ("@5", "@20"))]
            else:
                row += ["1 (reference)", "-", "-"]
            rows.append(row)
    label = " / ".join(names.get(s, s) for s in sets)
    head = ["query encoder", "method", "recall@10 (qrels)", "nDCG@10 (qrels)", f"answer recall@5, {label}",
            f"answer recall@20, {label}", "top-10 overlap / top-1 with torch",
            "change against torch: recall@10 / nDCG@10 [95% CI]", "change against torch: answer recall@5 / @20 [95% CI]"]
    n_answer = sum(d["answer_sets"].values())
    ties = ", ".join(f"`{b}` {'ties' if t else 'does not tie'}" for b, t in d["ties_torch"].items())
    q = d.get("onnx_int8", {})
    passages = int(re.search(r"passages=(\d+)", d["index"]).group(1))
    return (_table(head, rows)
            + f"\n\nwiki-default ({passages:,} passages), the same torch "
            "float32 passage vectors "
            f"for every row. qrels: the shipped HippoRAG qrels ({d['by_backend']['onnx']['dense']['difference_to_torch']['qrels']['recall@10']['queries']} "
            f"queries), documents. Answer recall@k: a gold answer in the text of one of the top k passages "
            f"(SQuAD normalisation, whole words) over {n_answer} shipped questions ("
            + ", ".join(f"{names.get(s, s)} {n}" for s, n in d["answer_sets"].items())
            + f"; yes/no answers left out); overlap and top-1 over the same questions, passages. Changes: mean "
            f"per-query difference to torch with its 95% paired bootstrap interval ({d['boot']:,} resamples), the "
            f"answer recall over all {n_answer} questions. A tie: every interval holds 0 and none reaches below "
            f"-{d['margin']}. {ties}; the default is `{d['decision']}`. int8: onnxruntime {q.get('onnxruntime', '?')}, "
            f"{q.get('file_mb', 0):.0f} MB. One run, {d['started'][:10]}, load {d['load_avg_1_5_15_at_start'][0]:.1f} "
            f"on {d['cpus']} cores. `{d['command']}`.")


def _curve(path: str, other: str, rerank: str = "re-rank") -> str:
    d = _load(path)
    rows = []
    for key in sorted(d["sizes"], key=int):
        r = d["sizes"][key]
        factory = r.get("dense", {}).get("IVF-PQ", {}).get("factory", "IVF-PQ")
        for label, s in r.get("search", {}).items():
            p = s.get("params", {})
            if "error" in s:
                continue
            rows.append([f"{int(key):,}", factory, str(p.get("nprobe")), str(p.get("rerank")), f"{s['recall@10']:.3f}",
                         f"{s['single_ms_p50']:.1f}", f"{s['batch64_ms_p50']:.0f}"])
    load = max(s.get("load_avg", [0])[0] for r in d["sizes"].values() for s in r.get("search", {}).values())
    return (_table(["N", "index", "nprobe", rerank, "recall@10", "1 query p50 ms", "64 queries p50 ms"], rows)
            + f"\n\nRecall@10 against exact search of 200 queries; synthetic topic-clustered vectors fitted to MiniLM "
            f"(as in the table above); one run, {d['started'][:10]}, on {d['machine']['cpus']} cores "
            + other.format(load=load) + f" `{_command(d['command'])}`.")


def ann_curve() -> str:
    return _curve("scripts/results/bench_ann_curve.json",
                  "shared with another CPU-bound process (load up to {load:.1f}), so latencies are high and noisy.")


def ann_curve_5m() -> str:
    return _curve("scripts/results/bench_ann_curve_5m.json",
                  "with no other long job (load up to {load:.1f}), one FAISS thread (OMP_NUM_THREADS=1). "
                  "Measured when each shard re-ranked `rerank` candidates (now `rerank` is split between the shards): "
                  "re-rank 100 here is 200 in all.", rerank="re-rank (a shard)")


ANN_CURVE_WIKI18 = "scripts/results/bench_ann_curve_wiki18.json"
ANN_CURVE_WIKI18_PQ32 = "scripts/results/bench_ann_curve_wiki18_pq32.json"
_WIKI18_IDLE = ("with the machine otherwise idle (load up to {load:.1f}), one FAISS thread a shard (OMP_NUM_THREADS=1), "
                "9 shards searched side by side on 2 threads")


def ann_curve_wiki18() -> str:
    return _curve(ANN_CURVE_WIKI18, _WIKI18_IDLE + ".", rerank="re-rank (in all)")


def ann_curve_wiki18_pq32() -> str:
    return _curve(ANN_CURVE_WIKI18_PQ32, _WIKI18_IDLE + "; the corpus and embeddings of the run above, the IVF-PQ "
                  "shards built anew with 32 sub-quantizers.", rerank="re-rank (in all)")


ANN_CURVE_WIKI18_OWN = "scripts/results/bench_ann_curve_wiki18_own.json"
ANN_CURVE_WIKI18_SHARED = "scripts/results/bench_ann_curve_wiki18_shared2048.json"
ANN_CURVE_WIKI18_SHARED8192 = "scripts/results/bench_ann_curve_wiki18_shared8192.json"


def ann_curve_wiki18_shared() -> str:
    """wiki-18's 9 shards each trained on its own rows, beside the same shards cloned from
    one quantizer trained once for all (drgym's layout), with as many lists and with 4x
    more."""
    rows, loads, runs = [], [], []
    for path, layout in ((ANN_CURVE_WIKI18_OWN, "one a shard"), (ANN_CURVE_WIKI18_SHARED, "one for all 9 shards"),
                         (ANN_CURVE_WIKI18_SHARED8192, "one for all 9 shards")):
        d = _load(path)
        runs.append(d)
        for key in sorted(d["sizes"], key=int):
            r = d["sizes"][key]
            factory = r["dense"]["IVF-PQ"]["factory"].removesuffix("+own")
            nlist = int(factory.split(",")[0][3:])
            for s in r.get("search", {}).values():
                if "error" in s:
                    continue
                p = s["params"]
                loads.append(s.get("load_avg", [0])[0])
                rows.append([factory, layout, str(s.get("coarse_searches", "-")), str(p["nprobe"]),
                             _pct(p["nprobe"] / nlist), str(p["rerank"]), f"{s['recall@10']:.3f}",
                             f"{s['single_ms_p50']:.1f}", f"{s['batch64_ms_p50']:.0f}"])
    head = ["index", "coarse quantizer", "coarse searches a query", "nprobe", "lists probed", "re-rank (in all)",
            "recall@10", "1 query p50 ms", "64 queries p50 ms"]
    own, shared, wide = runs
    return (_table(head, rows)
            + f"\n\n21,015,324 synthetic 384-d vectors in 9 shards (the corpus and embeddings of the tables above), "
            f"recall@10 against exact search of 200 queries; three runs on "
            f"{own['started'][:10]} (8,192 lists first, then one quantizer, then one a shard, one after the other), on {own['machine']['cpus']} cores with the machine otherwise idle (load up to "
            f"{max(loads):.1f}), one FAISS thread a shard (OMP_NUM_THREADS=1), 9 shards searched side by side on 2 "
            f"threads; the FAISS shards of each built beforehand on both cores by `python scripts/bench_scale.py "
            f"_stage dense WORK/n21015324 FACTORY`. Each shard trained alone: `{_command(own['command'])}`; one "
            f"quantizer: `{_command(shared['command'])}`; 8,192 lists: `{_command(wide['command_now'])}`.")


SHARED_QUANTIZER = "scripts/results/bench_shared_quantizer_wiki18.json"


def shared_quantizer() -> str:
    """The same 9 wiki-18 shards with one quantizer for all and with one each, timed query
    by query in turns, in each repeat of the comparison."""
    d = _load(SHARED_QUANTIZER)
    rows, loads = [], []
    passes = d["runs"][0]["layouts"][next(iter(d["runs"][0]["layouts"]))]["n"] // d["queries"]
    for run in d["runs"]:
        own, shared = (run["layouts"][f] for f in run["layouts"])  # the order of --factories: own first
        loads += run["load_avg_1min"]
        rows.append([str(run["repeat"] + 1), str(run["nprobe"]), f"{own['recall@10']:.3f} / {shared['recall@10']:.3f}",
                     f"{own['single_ms_p50']:.1f} / {own['single_ms_p99']:.1f}",
                     f"{shared['single_ms_p50']:.1f} / {shared['single_ms_p99']:.1f}",
                     f"{shared['ratio_to_first_p50']:.2f}"])
    head = ["run", "nprobe (of 2,048)", "recall@10, one a shard / one for all", "one quantizer a shard: p50 / p99 ms",
            "one for all: p50 / p99 ms", "median ratio, one for all / one a shard"]
    return (_table(head, rows)
            + f"\n\n{d['n_passages']:,} synthetic 384-d vectors in {d['shards']} shards of IVF2048,PQ48x4fs (the "
            f"embeddings of the tables above), re-rank 100 in all; {d['queries']} queries one at a time, the two "
            f"layouts in turns query by query ({passes} passes, order alternating), each run loading both anew; one FAISS "
            f"thread a shard (OMP_NUM_THREADS={d['machine']['omp_num_threads']}), shards side by side on 2 threads; "
            f"{d['started'][:10]}, {d['machine']['cpus']} cores, machine otherwise idle (load {min(loads):.1f}-"
            f"{max(loads):.1f}, the benchmark's own 2 threads included). "
            f"`{_command(d['command']).replace('--work WORK', '--work WORK/n' + str(d['n_passages']))}`.")


def _span(runs: list[dict], name: str, key: str, fmt: str = "{:.1f}") -> str:
    """A setting's figure over the runs of a side-by-side record: one value, or min-max."""
    v = [r["settings"][name][key] for r in runs]
    return fmt.format(min(v)) if min(v) == max(v) else f"{fmt.format(min(v))}-{fmt.format(max(v))}"


CALIBRATE = [("scripts/results/bench_calibrate_1e5.json", "IVF256,PQ48x4fs"),
             ("scripts/results/bench_calibrate_1e6.json", "IVF1024,PQ48x4fs"),
             ("scripts/results/bench_calibrate_5e6.json", "IVF2048,PQ48x4fs"),
             ("scripts/results/bench_calibrate_wiki18.json", "IVF2048,PQ48x4fs")]


def calibrate() -> str:
    """The nprobe each index measured on its own rows, and what it gives on the held-out
    queries against a quarter of the lists (scripts/bench_calibrate.py), one row a size."""
    rows, loads, found = [], [], []
    for path, _ in CALIBRATE:
        if not (REPO / path).exists():
            continue
        d = _load(path)
        found.append(d)
        c, runs = d["calibration"], d["runs"]
        loads += [x for r in runs for x in r["load_avg_1min"]]

        def span(name: str, key: str, fmt: str = "{:.1f}") -> str:
            return _span(runs, name, key, fmt)

        cal, quarter = runs[0]["settings"]["calibrated"], runs[0]["settings"]["quarter"]
        rows.append([f"{d['n_passages']:,}", f"{d['shards']} x {d['factory']}",
                     f"{c['search_params']['nprobe']:,} of {c['nlist']:,}",
                     f"{c['recall']:.3f} ({c['recall_low']:.3f})" if "recall_low" in c else f"{c['recall']:.3f}",
                     f"{cal['recall@10']:.3f} / {quarter['recall@10']:.3f} ({quarter['nprobe']:,})",
                     f"{span('calibrated', 'single_ms_p50')} / {span('quarter', 'single_ms_p50')}",
                     span("calibrated", "ratio_to_quarter_p50", "{:.2f}"), f"{c['seconds']:.0f}"])
    head = ["N", "shards x index", "nprobe measured (target 0.95)", "recall@10 on its own rows (95% lower bound)",
            "recall@10 held out: measured / a quarter (nprobe)", "1 query p50 ms: measured / a quarter",
            "median ratio", "calibration s"]
    if not found:
        return "(not measured yet)"
    d = found[-1]
    return (_table(head, rows)
            + f"\n\nSynthetic topic-mixture vectors fitted to MiniLM (384-d, as in the tables above), shards of "
            f"2,500,000 rows sharing one quantizer; the nprobe that `drgym.index.calibrate.calibrate_nprobe` records "
            f"(200 of the index's own rows as queries, each left out of its own top 10), then the size's 200 held-out "
            f"queries one at a time at that nprobe and at a quarter of the lists, in turns query by query (3 passes, "
            f"order alternating), {len(d['runs'])} runs each loading both anew (p50 and ratio: the range over the "
            f"runs); one FAISS thread a shard (OMP_NUM_THREADS={d['machine']['omp_num_threads']}), shards side by side "
            f"on 2 threads; {d['started'][:10]}, {d['machine']['cpus']} cores, machine otherwise idle (load "
            f"{min(loads):.1f}-{max(loads):.1f}, the benchmark's own 2 threads included). "
            f"`{_command(d['command']).replace('--work WORK', '--work WORK/n' + str(d['n_passages']))}` (the other "
            f"sizes: the same with their work folder, factory and output file, after `python scripts/bench_scale.py "
            f"_stage gen N WORK/nN`, `_stage import N WORK/nN 2500000 Flat` and `_stage dense WORK/nN FACTORY`).")


PROBE_GROUPS = [("scripts/results/bench_probe_groups_wiki18.json", "idle"),
                ("scripts/results/bench_probe_groups_wiki18_loaded.json", "a CPU-bound process on the other core"),
                ("scripts/results/bench_probe_groups_wiki18_nlist.json", "idle, a later hour")]
PROBE_GROUPS_COST = ["scripts/results/bench_probe_groups_1e5.json", "scripts/results/bench_probe_groups_1e6.json",
                     "scripts/results/bench_probe_groups_wiki18_sweep.json"]


CALIBRATION_SOURCE = "scripts/results/bench_calibration_source.json"
CALIBRATION_SOURCE_ROWS = [("rows", "the index's own rows, each left out (`source: rows`)"),
                           ("hipporag", "HippoRAG's HotpotQA and MuSiQue questions"),
                           ("nq-open", "NQ-open dev questions"),
                           ("shipped-questions", "both question sets (`source: shipped-questions`, the default)")]


def calibration_source() -> str:
    """Neighbour distances and recall curves of wiki-default as IVF-PQ for its own rows and
    for real questions (scripts/bench_calibration_source.py), and the nprobe each records."""
    d = _load(CALIBRATION_SOURCE)
    nlist = d["build_calibration"]["nlist"]
    rows = []
    for key, label in CALIBRATION_SOURCE_ROWS:
        r = d["by_queries"][key]
        best = max(p["recall"] for p in r["curve"])
        rows.append([label, f"{r['queries']}", f"{r['top1_cosine_median']:.3f}", f"{r['tenth_cosine_median']:.3f}",
                     f"{r['recall_at_quarter']:.3f}", f"{best:.3f}",
                     f"{r['nprobe_at_target']} of {nlist}" + ("" if r["reached"] else " (target not reached)")])
    head = ["queries", "n", "top-1 cosine (median)", "10th cosine (median)",
            f"recall@10 at a quarter of the lists ({nlist // 4})", "recall@10, best of the curve",
            f"nprobe recorded (target {d['target_recall']})"]
    b = d["build_calibration"]
    return (_table(head, rows)
            + f"\n\nwiki-default ({d['n_passages']:,} passages) built as `{d['factory']}` (what `auto`'s IVF-PQ rule "
            f"gives a shard of that size), its exact re-rank of the best {b['rerank']} candidates included; queries "
            f"encoded by the `{d['query_encoder_backend']}` query encoder; the curve: every nprobe of "
            f"`nprobe_grid({nlist})`. The build itself recorded `source: {b['source']}`, nprobe "
            f"{b['search_params']['nprobe']}, recall@10 {b['recall']:.3f}. One run, {d['started'][:10]}, load "
            f"{d['load_avg_1_5_15_at_start'][0]:.1f} on {d['cpus']} cores. `{d['command']}`.")


def _calibrations(d: dict) -> dict:
    """``{layout: calibration}`` of a bench_probe_groups.py record (one ``calibration``
    with its layout in older records)."""
    if d.get("calibrations"):
        return d["calibrations"]
    cal = d.get("calibration")
    return {cal["layout"]: cal} if cal else {}


def probe_groups() -> str:
    """One query at wiki-18 size on 9 shards and on one, in 1-4 probe groups, idle and
    beside a CPU-bound process (scripts/bench_probe_groups.py)."""
    rows, found = [], []
    for path, machine in PROBE_GROUPS:
        if not (REPO / path).exists():
            continue
        d = _load(path)
        found.append((d, machine))
        runs = d["runs"]
        for name, st in runs[0]["settings"].items():
            shards = d["layouts"][st["layout"]]["shards"]
            nlist = st["layout"].split(",")[0].removeprefix("IVF")
            rows.append([machine, f"{shards} x {st['layout'].split('+')[0]}", str(st["probe_groups"]),
                         str(st["jobs_per_query"]),
                         f"{st['nprobe']:,} of {int(nlist):,}" + (" (measured)" if "calibrated" in name else ""),
                         f"{st['recall@10']:.3f}", _span(runs, name, "single_ms_p50"),
                         _span(runs, name, "single_ms_p99"), _span(runs, name, "cpu_ms_p50"),
                         _span(runs, name, "ratio_to_first_p50", "{:.2f}")])
    if not found:
        return "(not measured yet)"
    head = ["machine", "shards x index", "probe_groups", "FAISS calls a query", "nprobe", "recall@10",
            "1 query p50 ms", "p99 ms", "CPU ms a query (p50)", "median ratio to the first row of its run"]
    d = found[0][0]
    measured = "".join(
        f" `calibrate_nprobe` on {dd['layouts'][lay]['shards']} x {lay.split('+')[0]} ({machine}; probe_groups "
        f"{dd['default_probe_groups']}) measured {cal['search_params']['nprobe']:,} of {cal['nlist']:,} lists "
        f"(recall@10 {cal['recall']:.3f} on its own rows, 95% lower bound {cal['recall_low']:.3f}) in "
        f"{cal['seconds']:.0f} s." for dd, machine in found for lay, cal in _calibrations(dd).items())
    def load(dd: dict) -> str:
        x = [v for r in dd["runs"] for v in r["load_avg_1min"]]
        return f"load {min(x):.1f}-{max(x):.1f}"

    cmds = "; ".join(f"{machine} ({load(dd)}): "
                     f"`{_command(dd['command']).replace('--work WORK', '--work WORK/n21015324')}`"
                     for dd, machine in found)
    return (_table(head, rows)
            + f"\n\n{d['n_passages']:,} synthetic 384-d vectors (the embeddings of the tables above) in 9 shards of "
            f"2.5×10^6 rows and in one shard, a clone of the same trained index (built by `python "
            f"scripts/bench_scale.py _stage dense WORK/n21015324 IVF2048,PQ48x4fs+s21015324`), and in one shard of "
            f"IVF4096,PQ48x4fs, what `auto` builds for one shard of this size (`... IVF4096,PQ48x4fs+s21015324`, "
            f"trained on its own sample); re-rank 100 in all; "
            f"200 held-out queries one at a time, every setting in turns query by query (3 passes, order "
            f"alternating), each run loading all anew (p50, p99, CPU and ratio: the range over the runs); one FAISS "
            f"thread a call (OMP_NUM_THREADS={d['machine']['omp_num_threads']}), calls side by side on up to 2 "
            f"threads; CPU time is the process's, every thread's; {d['started'][:10]}, {d['machine']['cpus']} cores "
            f"(the load averages below include the benchmark's own threads).{measured} The other "
            f"core's process: `python -c \"while True: pass\"`. {cmds}.")


def probe_groups_cost() -> str:
    """What splitting one query costs as the codes it scans grow: 1, 2 and 4 groups at
    10^5, 10^6 and 2.1x10^7 rows (scripts/bench_probe_groups.py --min-codes 0)."""
    rows, found = [], []
    for path in PROBE_GROUPS_COST:
        if not (REPO / path).exists():
            continue
        d = _load(path)
        found.append(d)
        runs = d["runs"]
        by = {}
        for name, st in runs[0]["settings"].items():
            by.setdefault(st["nprobe"], {})[st["probe_groups"]] = name
        lay = next(iter(d["layouts"]))
        nlist = int(lay.split(",")[0].removeprefix("IVF"))
        for nprobe, names in by.items():
            one = names[1]
            rows.append([f"{d['n_passages']:,}", f"{nprobe:,} of {nlist:,}",
                         f"{d['n_passages'] * nprobe // nlist:,}", _span(runs, one, "single_ms_p50", "{:.2f}")]
                        + [_span(runs, names[g], "ratio_to_fewest_groups_p50", "{:.2f}") if g in names else "-"
                           for g in (2, 4)]
                        + ["/".join(f"{runs[0]['settings'][names[g]]['cpu_ms_p50'] / runs[0]['settings'][one]['cpu_ms_p50']:.2f}"
                                    for g in (2, 4) if g in names)])
    if not found:
        return "(not measured yet)"
    head = ["N (one shard)", "nprobe", "codes a query", "1 group: 1 query p50 ms",
            "2 groups: median ratio of time", "4 groups: median ratio of time", "CPU ratio, 2 / 4 groups (run 1)"]
    d = found[-1]
    loads = [x for dd in found for r in dd["runs"] for x in r["load_avg_1min"]]
    return (_table(head, rows)
            + f"\n\nThe same settings as the table above, one layout a size (the one shard of 2.1×10^7, and the "
            f"one-shard indexes of 10^5 and 10^6 rows of the calibration table), every query split however few codes "
            f"a group scans (`--min-codes 0`); ratios are to the 1-group search of the same query, nprobe and run, "
            f"{len(d['runs'])} runs; {d['started'][:10]}, {d['machine']['cpus']} cores, machine otherwise idle (load "
            f"{min(loads):.1f}-{max(loads):.1f}). `{_command(d['command']).replace('--work WORK', '--work WORK/n21015324')}` "
            f"(10^5 and 10^6: the same with their work folder, layout and measured nprobe, 56 and 224).")


TABLES: dict[str, Callable[[], str]] = {
    "policy_options": policy_options,
    "answerable_pool": answerable_pool,
    "answerable_control": answerable_control,
    "answerable_run": answerable_run,
    "answerable_table": answerable_table,
    "answerable_hipporag": answerable_hipporag,
    "two_hop_test": two_hop_test,
    "evidence_run": evidence_run,
    "evidence_test": evidence_test,
    "evidence_hipporag": evidence_hipporag,
    "grpo_summary": grpo_summary,
    "bench_train_lora": bench_train_lora,
    "test_table": test_table,
    "scale": scale,
    "scale_paper": scale_paper,
    "sizing": sizing,
    "pq_codes": pq_codes,
    "scale_shards": scale_shards,
    "server_load": server_load,
    "search_r1_side_by_side": search_r1_side_by_side,
    "mmap_memory": mmap_memory,
    "main_job": main_job,
    "main_job_demo": main_job_demo,
    "main_job_load": main_job_load,
    "bench_search": bench_search,
    "retrieval": retrieval,
    "bench_train": bench_train,
    "bm25_engines": bm25_engines,
    "ann_curve": ann_curve,
    "ann_curve_5m": ann_curve_5m,
    "ann_curve_wiki18": ann_curve_wiki18,
    "ann_curve_wiki18_pq32": ann_curve_wiki18_pq32,
    "ann_curve_wiki18_shared": ann_curve_wiki18_shared,
    "shared_quantizer": shared_quantizer,
    "calibrate": calibrate,
    "calibration_source": calibration_source,
    "probe_groups": probe_groups,
    "probe_groups_cost": probe_groups_cost,
    "search_profile": search_profile,
    "search_profile_default": search_profile_default,
    "peer_default": peer_default,
    "search_encoders": search_encoders,
    "encoder_choice": encoder_choice,
}


# Where each table lives: the markdown file, relative to the repository.
TABLE_PAGES: dict[str, str] = {
    "policy_options": "docs/main-job.md",
    "main_job": "docs/benchmarks/main-job.md",
    "main_job_demo": "docs/benchmarks/main-job.md",
    "main_job_load": "docs/benchmarks/main-job.md",
    "bench_search": "docs/benchmarks/search.md",
    "server_load": "docs/benchmarks/search.md",
    "search_r1_side_by_side": "docs/benchmarks/search.md",
    "mmap_memory": "docs/scale.md",
    "retrieval": "docs/benchmarks/search.md",
    "scale": "docs/benchmarks/scale.md",
    "scale_paper": "docs/benchmarks/scale.md",
    "sizing": "docs/benchmarks/scale.md",
    "pq_codes": "docs/benchmarks/scale.md",
    "scale_shards": "docs/benchmarks/scale.md",
    "bench_train": "docs/benchmarks/training.md",
    "bm25_engines": "docs/benchmarks/scale.md",
    "ann_curve": "docs/benchmarks/scale.md",
    "ann_curve_5m": "docs/benchmarks/scale.md",
    "ann_curve_wiki18": "docs/benchmarks/scale.md",
    "ann_curve_wiki18_pq32": "docs/benchmarks/scale.md",
    "ann_curve_wiki18_shared": "docs/benchmarks/scale.md",
    "shared_quantizer": "docs/benchmarks/scale.md",
    "calibrate": "docs/benchmarks/scale.md",
    "calibration_source": "docs/benchmarks/scale.md",
    "probe_groups": "docs/benchmarks/scale.md",
    "probe_groups_cost": "docs/benchmarks/scale.md",
    "search_profile": "docs/benchmarks/search.md",
    "search_profile_default": "docs/benchmarks/search.md",
    "peer_default": "docs/benchmarks/search.md",
    "search_encoders": "docs/benchmarks/search.md",
    "encoder_choice": "docs/benchmarks/search.md",
    "grpo_summary": "docs/training.md",
    "test_table": "docs/training.md",
    "answerable_pool": "docs/training.md",
    "answerable_run": "docs/training.md",
    "answerable_control": "docs/training.md",
    "answerable_table": "docs/training.md",
    "answerable_hipporag": "docs/training.md",
    "two_hop_test": "docs/training.md",
    "evidence_run": "docs/training.md",
    "evidence_test": "docs/training.md",
    "evidence_hipporag": "docs/training.md",
    "bench_train_lora": "docs/training.md",
}


def pages() -> dict[str, list[str]]:
    """Each page of TABLE_PAGES and the tables it holds, in TABLES order."""
    out: dict[str, list[str]] = {}
    for name in TABLES:
        out.setdefault(TABLE_PAGES[name], []).append(name)
    return out


def render(name: str) -> str:
    """Table ``name`` as it stands between its markers (with the closing newline)."""
    return TABLES[name]() + "\n"


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- table:{re.escape(name)} -->\n)(.*?)(<!-- /table:{re.escape(name)} -->)", re.S)


def readme_table(text: str, name: str, page: str | None = None) -> str:
    """The generated part of markdown ``text`` for table ``name`` (what :func:`render` gives);
    KeyError, naming ``page`` (default: the table's page), when the markers are missing."""
    m = _pattern(name).search(text)
    if m is None:
        raise KeyError(f"{page or TABLE_PAGES.get(name, 'the page')} has no <!-- table:{name} --> ... "
                       f"<!-- /table:{name} --> block")
    return m.group(2)


def write(text: str, names: list[str], page: str = "the page") -> str:
    """``text`` with the generated part of each table in ``names`` replaced by :func:`render`;
    nothing else changes. KeyError, naming ``page``, when a table's markers are missing."""
    for name in names:
        pat = _pattern(name)
        if not pat.search(text):
            raise KeyError(f"{page} has no <!-- table:{name} --> ... <!-- /table:{name} --> block")
        text = pat.sub(lambda m, body=render(name): m.group(1) + body + m.group(3), text, count=1)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="replace the tables in their pages under docs/")
    g.add_argument("--check", action="store_true", help="exit 1 when a page's tables differ from the JSON")
    a = ap.parse_args(argv)
    if a.write:
        for page, names in pages().items():
            path = REPO / page
            text = path.read_text(encoding="utf-8")
            new = write(text, names, page)
            if new != text:
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text(new, encoding="utf-8")
                tmp.replace(path)  # atomic: a reader sees the old page or the new one
            print(f"{page} " + ("updated" if new != text else "already up to date"))
        return 0
    if a.check:
        stale = [f"{page}: {n}" for page, names in pages().items()
                 for n in names if readme_table((REPO / page).read_text(encoding="utf-8"), n, page) != render(n)]
        if stale:
            print(f"tables out of date: {'; '.join(stale)}; run python scripts/readme_tables.py --write")
            return 1
        print("every table matches the JSON")
        return 0
    for name, fn in TABLES.items():
        print(f"<!-- table:{name} -->\n{fn()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
