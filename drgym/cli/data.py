"""``drgym data``: task data. ``synth``: questions made from a corpus, verified by retrieval; ``pool``: the
answerable pool of a training env and its split; ``sft``: the SFT warm-start set by rejection sampling."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

data_app = typer.Typer(help="Task data: questions synthesised from a corpus, answerable pools, SFT data.", no_args_is_help=True,
                       rich_markup_mode=None)

HELD_OUT = "answerable-test,answerable-dev,hipporag-test,hipporag-dev,search-skill-test"


@data_app.command("synth")
def synth_cmd(
    config: str = typer.Option("smollm2_answerable_cpu", "--config", "-c",
                               help="Training config whose env verifies the questions (its search and env "
                                    "settings, exactly as training sees them)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for train.jsonl, dev.jsonl, test.jsonl (demo.jsonl) "
                                                     "and record.json."),
    corpus: Optional[str] = typer.Option(None, "--corpus", help="Passages to write questions from: a corpus file "
                                         "(any format `drgym index build` reads) or a named corpus; default: the "
                                         "config's search corpus."),
    corpus_format: Optional[str] = typer.Option(None, "--format", help="Corpus file format (default: sniffed)."),
    generator: str = typer.Option("rules", "--generator", "-g",
                                  help="'rules' (deterministic, no model), or a teacher: 'openai:MODEL@URL', "
                                       "'hf:NAME'."),
    held_out: str = typer.Option(HELD_OUT, "--held-out",
                                 help="Comma-separated task sets (names or files) never to overlap: their "
                                      "questions are dropped, and the documents the env shows for them are used "
                                      "by no slice. '' for none."),
    test_frac: float = typer.Option(0.06, "--test-frac", help="Share of documents for the test slice."),
    dev_frac: float = typer.Option(0.02, "--dev-frac", help="Share of documents for the dev slice."),
    demo_frac: float = typer.Option(0.0, "--demo-frac", help="Share of documents for a demo slice (demo.jsonl: a "
                                    "showcase used for nothing else)."),
    max_per_answer: int = typer.Option(3, "--max-per-answer", help="Most questions per answer string."),
    max_docs: Optional[int] = typer.Option(None, "--max-docs", help="Use a seeded sample of this many documents."),
    max_verify: Optional[int] = typer.Option(None, "--max-verify", help="Verify at most this many candidates."),
    seed: int = typer.Option(20261207, "--seed", help="Seeds the document split and samples."),
) -> None:
    """Write (question, answer, evidence) tasks from a corpus, kept when the env's own search shows the answer.

    Each question is searched through the config's env at its exact settings; it is kept
    only when a gold alias is in the observation. Questions are split by document (no test
    question's evidence document is in train). record.json holds every count kept and
    dropped, by stage, rule and answer type, and how the questions compare with NQ-open's.
    """
    from drgym.cli.train import _fail

    try:
        _synth(config, out, corpus, corpus_format, generator, held_out, test_frac, dev_frac, demo_frac,
               max_per_answer, max_docs, max_verify, seed)
    except Exception as e:  # noqa: BLE001
        _fail(e)


def _synth(config, out, corpus, corpus_format, generator, held_out, test_frac, dev_frac, demo_frac, max_per_answer,
           max_docs, max_verify, seed) -> None:
    import random
    import sys
    import time

    from drgym.atomic import atomic_write_json, atomic_write_text
    from drgym.corpus.named import NAMED, load_named_corpus
    from drgym.corpus.readers import read_corpus
    from drgym.envs.task_loaders import load_tasks
    from drgym.errors import ConfigError
    from drgym.records import Task
    from drgym.synth.pipeline import SynthSettings, question_profile, rules_generator, shown_docs, synthesize
    from drgym.training.config import load_config
    from drgym.training.data import make_env_factory

    t0 = time.perf_counter()
    settings = SynthSettings(seed=seed, test_frac=test_frac, dev_frac=dev_frac, demo_frac=demo_frac,
                             max_per_answer=max_per_answer, max_verify=max_verify)
    cfg = load_config(config)
    cfg.apply_threads()
    corpus = corpus or (cfg.search or {}).get("corpus")
    if not corpus:
        raise ConfigError(f"config {config!r} names no search corpus: pass --corpus FILE or a named corpus.")
    docs = load_named_corpus(corpus) if corpus in NAMED else list(read_corpus(corpus, corpus_format))
    if max_docs is not None:
        docs = random.Random(seed).sample(docs, min(max_docs, len(docs)))
    if generator == "rules":
        gen, gen_desc = rules_generator, {"generator": "rules", "module": "drgym.synth.rules"}
    else:
        from drgym.synth.teacher import TeacherGenerator

        gen = TeacherGenerator(generator)
        gen_desc = {"generator": generator}
    held_sets = [h.strip() for h in held_out.split(",") if h.strip()]
    held_tasks = [t for h in held_sets for t in load_tasks(h)]
    factory = make_env_factory(cfg, [Task(task_id="synth-probe", question="probe", answers=["probe"])])

    def say(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    held_docs = {d for row in shown_docs(factory, [t.question for t in held_tasks]) for d in row}
    say(f"{len(held_tasks)} held-out questions show {len(held_docs)} documents; none of them is used")
    res = synthesize(docs, gen, factory, settings=settings, held_out_questions=[t.question for t in held_tasks],
                     held_out_docs=held_docs, progress=say)
    if generator != "rules":
        gen_desc.update(gen.describe())
    nq = [t for t in load_tasks("nq-open")]
    profile = {"synth-train": question_profile([t.question for t in res.slices["train"]],
                                               [t.answers[0] for t in res.slices["train"]]),
               "synth-test": question_profile([t.question for t in res.slices["test"]],
                                              [t.answers[0] for t in res.slices["test"]]),
               "nq-open (200 dev questions)": question_profile([t.question for t in nq], [t.answers[0] for t in nq])}
    engine = factory().backend.identity()
    record = {
        "command": " ".join(["drgym data synth", *sys.argv[3:]]) if len(sys.argv) > 3 else "drgym data synth",
        "config": config, "corpus": corpus, "documents": len(docs), "generator": gen_desc,
        "engine": engine, "env": {"search": cfg.search, "env": cfg.env},
        "held_out": {"task_sets": held_sets, "questions": len(held_tasks), "documents": len(held_docs)},
        **res.record, "profile": profile, "seconds_total": round(time.perf_counter() - t0, 1),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in res.slices.items():
        atomic_write_text(out / f"{name}.jsonl", "".join(json.dumps(t.to_dict(), ensure_ascii=False) + "\n"
                                                         for t in rows))
    atomic_write_json(out / "record.json", record, indent=1)
    typer.echo(json.dumps({k: len(v) for k, v in res.slices.items()} | {"seconds": record["seconds_total"],
                                                                          "out": str(out)}))


@data_app.command("pool")
def pool_cmd(
    config: str = typer.Option("smollm2_answerable_cpu", "--config", "-c",
                               help="Training config whose env is the filter (its search and env settings)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="Folder for answerable_split.json, search_skill_pool.json and "
                                            "pool_record.json."),
    limit: Optional[int] = typer.Option(None, "--limit", help="First N questions of each source: counts only, "
                                        "nothing written (a quick look)."),
    check_split: bool = typer.Option(False, "--check-split", help="Only check that the shipped split files are "
                                     "what the split gives for their pools (exit 1 when not)."),
) -> None:
    """The answerable task pool of a training env and its seeded train/dev/test split.

    A question is kept when a gold alias is in the env's own observation for the question
    as query (drgym.training.answerable_pool says which sources, filters and split); the
    search-skill pool holds those whose gold is in the top 10 but not in view. The shipped
    task sets answerable-train/-dev/-test and search-skill-train/-test were made this way.
    """
    from drgym.cli.train import _fail

    try:
        _pool(config, out, limit, check_split)
    except Exception as e:  # noqa: BLE001  (_fail prints a drgym error in one line and re-raises the others)
        _fail(e)


def _pool(config: str, out: Optional[Path], limit: Optional[int], check_split: bool) -> None:
    import sys
    import time

    from drgym.atomic import atomic_write_json
    from drgym.errors import ConfigError
    from drgym.training.answerable_pool import build_pools, filter_pool, pool_settings, split_mismatches
    from drgym.training.config import load_config

    if check_split:
        bad = split_mismatches()
        typer.echo("split files are what the split makes" if not bad else f"differ from what the split makes: {bad}")
        raise typer.Exit(1 if bad else 0)
    if out is None and limit is None:
        raise ConfigError("give --out FOLDER for the pool files (or --limit N for counts only, or --check-split).")
    cfg = load_config(config)
    cfg.apply_threads()
    t0 = time.perf_counter()
    res = filter_pool(cfg, limit=limit, progress=lambda line: print(line, file=sys.stderr, flush=True))
    seconds = round(time.perf_counter() - t0, 1)
    if limit is not None:
        typer.echo(json.dumps({"seconds": seconds, "answerable": len(res["answerable"]),
                               "search_skill": len(res["search_skill"]), "stages": res["stages"]}, indent=1))
        return
    doc, sk_doc, record = build_pools(res, settings=pool_settings(config, cfg), seconds=seconds,
                                      command=f"drgym data pool --config {config} --out {out}")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "answerable_split.json", doc, indent=1)
    atomic_write_json(out / "search_skill_pool.json", sk_doc, indent=1)
    atomic_write_json(out / "pool_record.json", record, indent=1)
    typer.echo(json.dumps({k: record[k] for k in ("answerable", "search_skill", "split", "seconds")}))


@data_app.command("sft")
def sft_cmd(
    config: str = typer.Option("smollm2_drgym_cpu", "--config", "-c", help="Training config (env, search, turns)."),
    out: Path = typer.Option(Path("runs/sft_data"), "--out", "-o",
                             help="Folder for the sample runs, sft_trajectories.jsonl and sft_data_record.json."),
    tasks: str = typer.Option("hipporag-train", "--tasks", help="Train task set (dev/test questions are refused)."),
    k: int = typer.Option(8, "--k", help="Samples per question (one rollout run per seed)."),
    seed0: int = typer.Option(1, "--seed0", help="First sampling seed."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature."),
    n: Optional[int] = typer.Option(None, "--n", help="First N questions only (smoke runs)."),
    per_question: int = typer.Option(2, "--per-question", help="Most distinct episodes kept per question."),
    greedy: bool = typer.Option(False, "--greedy", help="Add a greedy run of the scaffolded model."),
    question_query: bool = typer.Option(False, "--question-query", help="Add the scripted policy (search = the "
                                        "question)."),
    two_hop: bool = typer.Option(False, "--two-hop", help="Add the bridge run (search the question, then a "
                                 "supporting title named in the results)."),
    two_hop_copies: int = typer.Option(1, "--two-hop-copies", help="Write each kept two-hop episode this many "
                                       "times (oversampling)."),
    build_only: bool = typer.Option(False, "--build-only", help="Skip sampling (use the existing sample runs)."),
) -> None:
    """The SFT warm-start set by rejection sampling: roll the model out on train questions, keep
    the episodes whose answer is read off what they retrieved (drgym.training.sft_data), write
    OUT/sft_trajectories.jsonl (the input of `drgym train sft -t`) and OUT/sft_data_record.json.
    """
    from drgym.cli.train import _fail

    try:
        _sft(config, out, tasks, k, seed0, temperature, n, per_question, greedy, question_query, two_hop,
             two_hop_copies, build_only)
    except Exception as e:  # noqa: BLE001  (_fail prints a drgym error in one line and re-raises the others)
        _fail(e)


def _sft(config, out, tasks, k, seed0, temperature, n, per_question, greedy, question_query, two_hop,
         two_hop_copies, build_only) -> None:
    import shlex
    import sys

    from drgym.training.config import load_config
    from drgym.training.sft_data import build, sample, sample_dirs

    cfg = load_config(config)
    cfg.apply_threads()
    if build_only:
        dirs = sample_dirs(out, k=k, seed0=seed0, greedy=greedy, question_query=question_query, two_hop=two_hop)
    else:
        dirs = sample(cfg, out, k=k, temperature=temperature, task_set=tasks, n=n, seed0=seed0, greedy=greedy,
                      question_query=question_query, two_hop=two_hop)
    rec = build(out, dirs, task_set=tasks, per_question=per_question, two_hop_copies=two_hop_copies,
                command="drgym data sft " + shlex.join(sys.argv[3:]))
    typer.echo(json.dumps({key: rec[key] for key in ("kept", "kept_by_source", "questions_with_kept_episodes",
                                                     "filter_counts")}, indent=1))


def register(app: typer.Typer) -> None:
    """Add ``data synth``, ``data pool`` and ``data sft`` to ``app``."""
    app.add_typer(data_app, name="data")
