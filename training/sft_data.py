"""The SFT warm-start set, by rejection sampling from the model itself (train questions only).

Step 1, ``sample``: the scaffolded bundled model (``hf:smollm2``, ``scaffold=auto``:
it writes the query, then the answer) is rolled out ``--k`` times per question of
``hipporag-train`` at temperature ``--temperature`` (one ``drgym rollout`` run directory
per sampling seed, ``<out>/samples/seed_<s>/``), in the training env of the run config
(search backend, ``top_k``, ``max_obs_tokens``, turns). Reruns resume.

With ``--greedy`` one more run decodes greedily (``samples/greedy``), and with
``--question-query`` the scripted policy searches each question verbatim and answers
(``samples/scripted``, no fetch). With ``--two-hop`` a bridge run (``samples/two_hop``,
:class:`BridgePolicy`) searches the question, then, when the gold is not yet in view, the
title of a supporting paragraph that the first results name, and answers with the gold
span it read.

Step 2, ``build``: every episode is checked against the text it retrieved (the
``<information>`` blocks before its answer) and kept from one of three sources:

- ``own_correct``: the model's own answer is right (SQuAD exact match with a gold alias,
  after normalisation) and occurs in the retrieved text (normalised substring);
- ``own_search_gold_span``: the answer is wrong, but the model's own searches retrieved
  a gold alias; the answer turn is replaced by that span as it is written in the
  retrieved text (a supported answer, never one the model could not have read);
- ``question_search_gold_span`` (``--question-query`` runs): the search is the question
  itself; kept only when it retrieved a gold alias, answered with that span.
- ``two_hop_bridge_gold_span`` (``--two-hop`` runs): two searches, the question and then
  a bridge query (the title of one of the task's supporting paragraphs, ``gold_docs``,
  without its parenthesised part); kept only when the first results do not hold a gold
  alias, name the bridge (so the second query is read off the first results, not off the
  label), and the second results hold a gold alias, answered with that span. These teach
  the second hop: search again, with an entity read in the first results, when the answer
  is not there yet.

Episodes whose retrieved text holds no gold alias are dropped (training on them would
teach the model to guess), and so are yes/no questions (a "yes" cannot be read off the
text, so the label could only be guessed). Per question at most ``--per-question``
distinct episodes are kept, in this order: own correct answers, the question-as-query
and bridge episodes, then the model's own searches. (At temperature 1 SmolLM2's queries are mostly
noise; a first SFT that kept its own searches before the question-as-query episode
taught an agent that searched badly and scored F1 0.000 on the dev slice.)

The kept episodes go to ``<out>/sft_trajectories.jsonl`` (``Trajectory`` records, the
input of ``drgym train sft -t``), and the counts per source, per question set and per
filter to ``<out>/sft_data_record.json`` (copied to ``training/results/``).

``scripts/make_sft_data.py`` is the command line of :func:`sample` and :func:`build`::

    python scripts/make_sft_data.py --config smollm2_drgym_cpu --out runs/sft_data --k 4 --greedy --question-query
    python scripts/make_sft_data.py --config smollm2_two_hop_cpu --out runs/two_hop_data --k 0 --question-query --two-hop --two-hop-copies 3
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

from drgym.atomic import atomic_write_json, read_jsonl
from drgym.envs.driver import write_trajectories
from drgym.envs.task_loaders import hipporag_split, load_tasks
from drgym.errors import ConfigError
from drgym.evaluation.runner import RolloutConfig, run_rollout
from drgym.records import Trajectory
from drgym.rewards.qa import exact_match, normalize_answer
from drgym.search.registry import backend_from_settings

log = logging.getLogger(__name__)

YES_NO = {"yes", "no"}


def retrieved_text(traj: dict, upto: int) -> str:
    """The observations of steps before ``upto`` that are search results (``<information>`` blocks)."""
    return "\n".join(s.get("observation") or "" for s in traj["steps"][:upto] if "<information>" in (s.get("observation") or ""))


def find_span(text: str, golds: list[str]) -> str | None:
    """The first gold alias found in ``text``, as written there (case-insensitive, word-bounded), else None.

    Falls back to a normalised-substring match (punctuation, articles), returning the gold
    alias itself.
    """
    for g in sorted(golds, key=len, reverse=True):
        g = g.strip()
        if not g:
            continue
        m = re.search(r"(?<!\w)" + re.escape(g) + r"(?!\w)", text, re.IGNORECASE)
        if m:
            return m.group(0)
    norm = f" {normalize_answer(text)} "
    for g in sorted(golds, key=len, reverse=True):
        ng = normalize_answer(g)
        if ng and f" {ng} " in norm:
            return g.strip()
    return None


def supported(answer: str, text: str) -> bool:
    """True when the normalised ``answer`` occurs in the normalised ``text`` as whole words."""
    na = normalize_answer(answer)
    return bool(na) and f" {na} " in f" {normalize_answer(text)} "


def _bare_title(title: str) -> str:
    """A Wikipedia title without its parenthesised disambiguation: ``"Lilu (mythology)"`` -> ``"Lilu"``."""
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip()


def bridge_query(task, first_results: str) -> str | None:
    """The second-hop query of :class:`BridgePolicy` for ``task``, or None.

    The first title of ``task.gold_docs`` (supporting paragraphs, in the dataset's order)
    whose bare form (:func:`_bare_title`) is not in the question and is in
    ``first_results`` (normalised, whole words): an entity the agent has just read.
    """
    q = f" {_norm(task.question)} "
    seen = f" {_norm(first_results)} "
    for title in task.gold_docs or []:
        bare = _bare_title(str(title))
        nb = _norm(bare)
        if nb and f" {nb} " not in q and f" {nb} " in seen:
            return bare
    return None


def _norm(text: str) -> str:
    """SQuAD normalisation with punctuation read as a word break (``"Eagles.</information>"`` ->
    ``"eagles information"``, not ``"eaglesinformation"``), the same for titles and results."""
    return normalize_answer(re.sub(r"[^\w\s]", " ", text))


class BridgePolicy:
    """The two-hop teacher of ``--two-hop`` (an oracle: it reads the task's labels).

    Turn 0: search the question. Turn 1: if the results hold a gold alias, answer with it;
    else search :func:`bridge_query` (None: answer "unknown", an episode the build drops).
    Turn 2: answer with the gold span of everything retrieved, else "unknown".

    Args:
        tasks: the tasks by ``task_id`` (answers and ``gold_docs`` are read).
    """

    name = "two-hop-bridge"

    def __init__(self, tasks: dict) -> None:
        self.tasks = tasks
        self._seen: dict[str, str] = {}

    def act_one(self, info: dict) -> str:
        """The action for one episode given its latest ``info`` (with ``"observation"``)."""
        turn = int(info.get("turn", 0))
        ep = str(info.get("episode_id", ""))
        task = self.tasks[info["task_id"]]
        if turn == 0:
            self._seen[ep] = ""
            return f"<search> {task.question} </search>"
        obs = info.get("observation") or ""
        self._seen[ep] = self._seen.get(ep, "") + "\n" + (obs if "<information>" in obs else "")
        span = find_span(self._seen[ep], list(task.answers))
        if span is None and turn == 1 and info.get("searches_left", 0) > 0:
            q = bridge_query(task, self._seen[ep])
            if q is not None:
                return f"<search> {q} </search>"
        self._seen.pop(ep, None)
        return f"<answer> {span or 'unknown'} </answer>"

    def act(self, conversations: list, infos: list[dict] | None = None) -> list[str]:
        """One action per conversation; needs the env ``infos``."""
        if infos is None:
            raise ValueError("BridgePolicy needs the env infos: call act(conversations, infos).")
        return [self.act_one(i) for i in infos]

    def close(self) -> None:
        """Nothing to free."""


def sample_dirs(out: Path, *, k: int, seed0: int, greedy: bool, question_query: bool,
                two_hop: bool = False) -> list[Path]:
    """The run directories of the sampling step, in build order."""
    dirs = [out / "samples" / f"seed_{s}" for s in range(seed0, seed0 + k)]
    if greedy:
        dirs.append(out / "samples" / "greedy")
    if question_query:
        dirs.append(out / "samples" / "scripted")
    if two_hop:
        dirs.append(out / "samples" / "two_hop")
    return dirs


def sample(cfg, out: Path, *, k: int, temperature: float, task_set: str, n: int | None, seed0: int,
           greedy: bool = False, question_query: bool = False, two_hop: bool = False) -> list[Path]:
    """Run the rollouts of step 1 (see the module docstring); return their run dirs.

    ``k`` sampled runs of the scaffolded ``hf:smollm2`` (bf16 on CPU, the hf: default),
    one seed each; a greedy one with ``greedy``; the scripted policy with ``question_query``;
    :class:`BridgePolicy` with ``two_hop``.
    """
    env_kw = dict(cfg.env.get("kwargs") or {})
    backend = backend_from_settings(cfg.search)
    dirs = sample_dirs(out, k=k, seed0=seed0, greedy=greedy, question_query=question_query, two_hop=two_hop)
    for d in dirs:
        policy_obj = None
        if d.name == "two_hop":
            policy_obj = BridgePolicy({t.task_id: t for t in load_tasks(task_set)})
            policy, seed, opts = BridgePolicy.name, 0, {}
        elif d.name == "scripted":
            policy, seed, opts = "scripted", 0, {"fetch": False}
        elif d.name == "greedy":
            policy, seed, opts = "hf:smollm2", 0, {}
        else:
            policy, seed, opts = "hf:smollm2", int(d.name.split("_")[1]), {"temperature": temperature}
        rc = RolloutConfig(env=cfg.env["id"], tasks=task_set, policy=policy, backend=f"training:{cfg.search}", n=n,
                           out=str(d), seed=seed, batch_size=8, max_turns=cfg.rollout_settings().max_turns,
                           policy_options=opts, env_options=env_kw, plots=False)
        t0 = time.perf_counter()
        res = run_rollout(rc, backend=backend, progress=False, policy=policy_obj)
        log.info("%s: %d episodes (%d new) in %.0f s, f1 %.3f", d.name, len(res.trajectories), res.new_episodes,
                 time.perf_counter() - t0, res.metrics.get("f1") or 0.0)
    return dirs


def build(out: Path, sample_dirs: list[Path], *, task_set: str, per_question: int, two_hop_copies: int = 1,
          command: str = "") -> dict:
    """Filter the sampled episodes (see the module docstring); write the SFT JSONL
    (``out/sft_trajectories.jsonl``) and the record (``out/sft_data_record.json``, returned).

    ``two_hop_copies``: each kept two-hop episode is written this many times (oversampling:
    the one token that chooses a second search over an answer is a small part of the loss).
    ``command``: the command line recorded as ``made_by``.

    Raises:
        ConfigError: ``two_hop_copies`` below 1, or ``task_set`` holds dev/test questions.
    """
    if two_hop_copies < 1:
        raise ConfigError(f"--two-hop-copies must be >= 1, got {two_hop_copies}.")
    tasks = {t.task_id: t for t in load_tasks(task_set)}
    split = hipporag_split()
    not_train = set(split["dev"]) | set(split["test"])
    if set(tasks) & not_train:
        raise ConfigError(f"{task_set} holds dev/test questions; SFT data must come from train questions only.")
    counts = {"episodes": 0, "yes_no_question": 0, "no_answer": 0, "gold_not_retrieved": 0, "own_correct": 0,
              "own_search_gold_span": 0, "question_search_gold_span": 0, "own_correct_unsupported": 0,
              "two_hop_one_search": 0, "two_hop_gold_not_in_second": 0, "two_hop_bridge_gold_span": 0,
              "duplicates": 0, "over_cap": 0}
    per_run = {}
    per_q: dict[str, list[tuple[int, Trajectory]]] = {}
    for d in sample_dirs:
        scripted = d.name == "scripted"
        rows = read_jsonl(d / "trajectories.jsonl")
        per_run[d.name] = {"episodes": len(rows), "f1": sum(float((r.get("reward_components") or {}).get("f1") or 0)
                                                           for r in rows) / max(1, len(rows))}
        for row in rows:
            counts["episodes"] += 1
            t = tasks.get(row["task_id"])
            if t is None:
                continue
            if {normalize_answer(a) for a in t.answers} & YES_NO:
                counts["yes_no_question"] += 1
                continue
            steps = row.get("steps") or []
            last = len(steps) - 1
            ans = row.get("final_answer")
            if not steps or ans is None or "<answer>" not in (steps[last].get("action") or ""):
                counts["no_answer"] += 1
                continue
            if d.name == "two_hop":
                searched = [i for i, st in enumerate(steps[:last]) if "<search>" in (st.get("action") or "")]
                if len(searched) < 2:  # gold in the first results, or no bridge named there
                    counts["two_hop_one_search"] += 1
                    continue
                second = steps[searched[1]].get("observation") or ""
                span = find_span(second, list(t.answers))
                if find_span(retrieved_text(row, searched[1]), list(t.answers)) is not None or span is None:
                    counts["two_hop_gold_not_in_second"] += 1
                    continue
                traj = Trajectory.from_dict(row)
                traj.steps[last].action = f"<answer> {span} </answer>"
                traj.final_answer = span
                traj.metadata = {**traj.metadata, "sft_source": "two_hop_bridge_gold_span", "sample_dir": d.name,
                                 "bridge_query": re.sub(r"</?search>", "", steps[searched[1]]["action"]).strip()}
                counts["two_hop_bridge_gold_span"] += 1
                per_q.setdefault(t.task_id, []).append((1, traj))
                continue
            text = retrieved_text(row, last)
            span = find_span(text, list(t.answers))
            if span is None:
                counts["gold_not_retrieved"] += 1
                continue
            traj = Trajectory.from_dict(row)
            if not scripted and exact_match(ans, t.answers) == 1.0 and supported(ans, text):
                counts["own_correct"] += 1
                traj.metadata = {**traj.metadata, "sft_source": "own_correct", "sample_dir": d.name}
                per_q.setdefault(t.task_id, []).append((0, traj))
                continue
            if not scripted and exact_match(ans, t.answers) == 1.0:
                counts["own_correct_unsupported"] += 1  # right by luck: kept only as a gold-span episode
            s = traj.steps[last]
            s.action = re.sub(r"<answer>.*?</answer>", f"<answer> {span} </answer>", s.action, count=1, flags=re.DOTALL)
            traj.final_answer = span
            source = "question_search_gold_span" if scripted else "own_search_gold_span"
            traj.metadata = {**traj.metadata, "sft_source": source, "sample_dir": d.name, "policy_answer": ans}
            counts[source] += 1
            per_q.setdefault(t.task_id, []).append((1 if scripted else 2, traj))
    kept: list[Trajectory] = []
    by_source = {"own_correct": 0, "own_search_gold_span": 0, "question_search_gold_span": 0,
                 "two_hop_bridge_gold_span": 0}
    by_set = {}
    for tid in tasks:  # task order, deterministic
        seen = set()
        n = 0
        for _prio, traj in sorted(per_q.get(tid, []), key=lambda x: x[0]):
            key = tuple(s.action for s in traj.steps)
            if key in seen:
                counts["duplicates"] += 1
                continue
            if n >= per_question:
                counts["over_cap"] += 1
                continue
            seen.add(key)
            n += 1
            kept.append(traj)
            by_source[traj.metadata["sft_source"]] += 1
            src = tasks[tid].source
            by_set[src] = by_set.get(src, 0) + 1
    distinct = len(kept)
    kept += [t for t in kept if t.metadata["sft_source"] == "two_hop_bridge_gold_span"] * (two_hop_copies - 1)
    path = out / "sft_trajectories.jsonl"
    if path.exists():
        path.unlink()
    write_trajectories(path, kept)
    record = {
        "made_by": command,
        "task_set": task_set, "questions": len(tasks),
        "questions_with_kept_episodes": len({t.task_id for t in kept}),
        "sample_runs": {str(d): per_run[d.name] for d in sample_dirs},
        "kept": distinct, "kept_by_source": by_source, "two_hop_copies": two_hop_copies, "written": len(kept), "kept_by_question_source": by_set,
        "per_question_cap": per_question, "filter_counts": counts,
        "searches_per_kept_episode": sum(sum(1 for s in t.steps for c in s.tool_calls if c.name == "search")
                                         for t in kept[:distinct]) / max(1, distinct),
        "rules": {
            "own_correct": "model's answer has exact match 1 with a gold alias and occurs in the retrieved text",
            "own_search_gold_span": "model's own searches retrieved a gold alias; the answer turn is that span as written in the retrieved text",
            "question_search_gold_span": "scripted policy searched the question verbatim and retrieved a gold alias; answered with that span",
            "two_hop_bridge_gold_span": "searched the question, then the bare title of a supporting paragraph named in the first results and absent from the question; kept when the first results hold no gold alias and the second do; answered with that span",
            "priority": "per question: own_correct, then question_search_gold_span and two_hop_bridge_gold_span, then own_search_gold_span (the model's T=1 queries are mostly noise), distinct action sequences, at most per_question_cap",
            "dropped": "no gold alias in the retrieved text; yes/no questions; episodes with no answer",
        },
        "output": str(path),
    }
    atomic_write_json(out / "sft_data_record.json", record)
    return record
