"""Your own TRL ``GRPOTrainer`` script over a drgym environment.

drgym supplies the env (search over a local index, observations masked out of the loss),
the multi-turn rollout function and the rewards; the trainer, its config and the loop are
TRL's own. Run it (2 steps of 2 questions x 2 rollouts on CPU, a few minutes)::

    python docs/examples/own_grpo_trainer.py --max-steps 2 --out runs/own_grpo
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=2)
    ap.add_argument("--out", default="runs/own_grpo")
    a = ap.parse_args()

    import torch
    from trl import GRPOConfig, GRPOTrainer

    from drgym.envs import load_tasks
    from drgym.models import load_model, load_tokenizer
    from drgym.rewards import build_reward
    from drgym.training import (SearchRolloutFunc, TRLReward, build_dataset, load_config,
                                make_env_factory)

    # the env and rollout settings of a bundled config; any YAML of yours works the same
    cfg = load_config("searchqa_smollm2_cpu", {
        "env": {"id": "drgym/SearchQA-v0", "kwargs": {"top_k": 2, "max_obs_tokens": 80, "max_fetches": 0}},
        "rollout": {"max_turns": 2, "max_new_tokens": 16, "max_completion_tokens": 256, "gen_batch_size": 4},
    })
    torch.set_num_threads(1)
    tasks = load_tasks("hotpotqa-dev")[:4]
    tok = load_tokenizer("smollm2")
    model = load_model("smollm2", dtype=torch.float32)
    for p in model.parameters():  # train the last decoder layer only (CPU)
        p.requires_grad_(False)
    for p in model.model.layers[-1].parameters():
        p.requires_grad_(True)

    env_factory = make_env_factory(cfg, tasks)              # envs sharing one search backend
    dataset, table = build_dataset(tasks, env_factory, tok)  # prompt, task_id, question, answers
    rollout = SearchRolloutFunc(env_factory, table, cfg.rollout_settings())
    f1 = TRLReward(build_reward({"f1": {"max_answer_tokens": 10}}))  # reads the dataset's `answers` column

    args = GRPOConfig(output_dir=a.out, max_steps=a.max_steps, per_device_train_batch_size=4, num_generations=2,
                      learning_rate=1e-5, logging_steps=1, save_strategy="no", report_to="none",
                      max_completion_length=cfg.rollout_settings().max_completion_tokens, temperature=1.0,
                      use_cpu=True, bf16=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[f1], args=args, train_dataset=dataset, processing_class=tok,
                          rollout_func=rollout)
    trainer.train()
    import json

    logs = [h for h in trainer.state.log_history if "reward" in h]
    print(json.dumps({"step": trainer.state.global_step, "reward": logs[-1]["reward"] if logs else None,
                      "train_loss": trainer.state.log_history[-1].get("train_loss")}))


if __name__ == "__main__":
    main()
