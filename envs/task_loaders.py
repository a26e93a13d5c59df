"""Task loaders for the QA and research sets in ``shared/data``, and a name registry.

Every loader returns ``list[Task]`` in file order with stable ``task_id`` values.

==================  ======================================================  ======  ========
name                source (format)                                         rows    shipped
==================  ======================================================  ======  ========
hotpotqa-dev        HippoRAG ``hotpotqa_train.json`` (JSON, repr fields)    79      yes
musique-dev         HippoRAG ``musique_train.json``                         80      yes
hipporag            both of the above                                       159     yes
hipporag-train      fixed split of ``hipporag``: train slice                79      yes
hipporag-dev        its dev slice (choosing settings)                       20      yes
hipporag-test       its test slice; [:20] = hotpotqa-dev[:20] (main job)    60      yes
answerable-train    answerable pool (gold in the training env's             ~200    yes
                    observation with the question as query): train slice
answerable-dev      its dev slice (choosing settings)                       30      yes
answerable-test     its test slice (final figures only)                     >=400   yes
answerable-train-wide  answerable-train plus the answerable questions of    ~470    yes
                    R1-Searcher's training sets (r1-stage1, r1-stage2)
answerable-train-wide-capped  the same, at most 3 questions per gold answer   ~320    yes
                    (136 of the 461 have the gold "American")
synth-train         questions synthesised from wiki-default documents and   ~10k    yes
                    verified in the answerable env (``drgym data synth``)
synth-dev           the same, from documents of no other slice              ~200    yes
synth-test          the same, from documents of no other slice (final)      >=400   yes
synth-demo          the same, from documents of no other slice: the main    ~100    yes
                    job's questions (``drgym rollout``'s default), used
                    for nothing else
breadth-train       answerable-train-wide-capped plus synth-train,          ~10k    yes
                    one task per question
search-skill-train  gold in the top-10 but not in the top-3 observation     rest    yes
search-skill-test   its test slice                                          200     yes
nq-open             NQ-open dev, first 200 rows (JSONL)                     200     yes
nq-open-full        NQ-open dev (JSONL)                                     2,819   shared
efficientqa-dev     EfficientQA dev (NQ-open JSONL)                         1,440   shared
efficientqa-test    EfficientQA test (NQ-open JSONL)                        1,416   shared
bamboogle           R1-Searcher ``eval_set/bamboogle.jsonl``                66      yes
r1-hotpotqa         R1-Searcher ``eval_set/hotpotqa_500.jsonl``             393     yes
r1-2wiki            R1-Searcher ``eval_set/2wiki_500.jsonl``                398     yes
r1-musique          R1-Searcher ``eval_set/musique_500.jsonl``              379     yes
r1-stage1           R1-Searcher ``training_set/stage_1.jsonl``              240     shared
r1-stage2           R1-Searcher ``training_set/stage_2.jsonl`` (RL          6,478   yes
                    training questions, HotpotQA + 2WikiMultihopQA train)
deepresearcher-dev  DeepResearcher ``dev.parquet`` (aliases split on        627     yes
                    ``<|answer_split|>``)
deepresearcher-test DeepResearcher ``test.parquet``                         2,448   shared
simpleqa            SimpleQA test, first 100 rows (CSV)                     100     yes
simpleqa-full       SimpleQA test (CSV)                                     3,461   shared
frames              FRAMES test, first 50 rows (CSV)                        50      yes
frames-full         FRAMES test (CSV)                                       660     shared
browsecomp-plus     BrowseComp-Plus decrypted queries (JSONL) + qrels       830     shared
drb                 DeepResearch Bench ``query.jsonl`` (research)           90      yes
drb-en / drb-zh     its English / Chinese prompts                           40/50   yes
researchy           DeepResearchGym Researchy queries + key points          1,000   shared
researchy-100       the 100-query sample, with key points                   100     shared
==================  ======================================================  ======  ========

The ``hipporag-*`` slices are listed by task id in ``hipporag_split.json``, written by
``scripts/make_hipporag_split.py`` (seeded, stratified by source). The ``answerable-*``
and ``search-skill-*`` sets are shipped whole (question and aliases) in
``answerable_split.json`` and ``search_skill_pool.json``, written by
``scripts/make_answerable_pool.py`` from NQ-open, EfficientQA, the DeepResearcher mixes
and ``hipporag-train``.

"shipped" files are in ``drgym/data/tasks`` (see DATA_NOTICE.md); "shared" files are read
from ``$DRGYM_SHARED_DATA`` or ``<repo>/../shared/data`` and raise a clear error when
absent. DeepResearchGym's files have no licence and are never copied.

Other sets: :func:`load_hf_tasks` reads any local file that ``datasets`` can load.
"""

from __future__ import annotations

import ast
import csv
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

from drgym.atomic import decode_line, load_jsonl_strict
from drgym.corpus.qrels import read_qrels
from drgym.errors import ConfigError, CorpusError, unknown_name
from drgym.paths import DATA_DIR
from drgym.records import Task
from drgym.rewards.qa import normalize_answer

TASKS_DIR = DATA_DIR / "tasks"
ANSWER_SPLIT = "<|answer_split|>"


def shared_data_dir() -> Path:
    """``$DRGYM_SHARED_DATA`` if set, else ``<repository>/../shared/data`` (may not exist)."""
    env = os.environ.get("DRGYM_SHARED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def _shared(rel: str) -> Path:
    p = shared_data_dir() / rel
    if not p.exists():
        raise CorpusError(
            f"{p} does not exist: this task set is not shipped with drgym. Point DRGYM_SHARED_DATA at a folder "
            f"holding {rel}, or load the file with the matching loader in drgym.envs.task_loaders."
        )
    return p


def _literal(v: Any) -> Any:
    """HippoRAG stores lists as Python-repr strings; parse them (JSON-native values pass through)."""
    if isinstance(v, str) and v[:1] in "[{(":
        try:
            return ast.literal_eval(v)
        except (ValueError, SyntaxError):
            return v
    return v


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return load_jsonl_strict(path, error=CorpusError)


def _dedupe(answers: list[str]) -> list[str]:
    out: list[str] = []
    for a in answers:
        a = str(a).strip()
        if a and a not in out:
            out.append(a)
    return out


# -- loaders ---------------------------------------------------------------------------
def load_hipporag_hotpotqa(path: str | Path, *, source: str = "hotpotqa") -> list[Task]:
    """HippoRAG's HotpotQA JSON (a list of HotpotQA distractor-setting records).

    ``supporting_facts`` (``[[title, sentence_idx], ...]``, a Python-repr string) gives
    ``gold_docs`` (unique titles, in order); ``context`` is dropped (the paragraphs are in
    the corpus). ``metadata``: ``type``, ``level``, ``gold_docs_kind="title"``.
    """
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    tasks = []
    for r in rows:
        facts = _literal(r.get("supporting_facts") or [])
        titles = _dedupe([f[0] for f in facts if isinstance(f, (list, tuple)) and f])
        tasks.append(Task(
            task_id=f"{source}-{r['_id']}",
            question=r["question"].strip(),
            answers=_dedupe([r["answer"]]),
            kind="qa",
            gold_docs=titles,
            source=source,
            metadata={"type": r.get("type"), "level": r.get("level"), "gold_docs_kind": "title"},
        ))
    return tasks


def load_hipporag_musique(path: str | Path, *, source: str = "musique") -> list[Task]:
    """HippoRAG's MuSiQue JSON: answers are ``answer`` + ``answer_aliases``.

    ``gold_docs`` are the titles of the paragraphs with ``is_supporting`` true;
    ``metadata`` keeps the ``question_decomposition`` (list of sub-questions) and
    ``answerable``.
    """
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    tasks = []
    for r in rows:
        paras = _literal(r.get("paragraphs") or [])
        titles = _dedupe([p.get("title", "") for p in paras if isinstance(p, dict) and p.get("is_supporting")])
        aliases = _literal(r.get("answer_aliases") or [])
        tasks.append(Task(
            task_id=f"{source}-{r['id']}",
            question=r["question"].strip(),
            answers=_dedupe([r["answer"], *(aliases if isinstance(aliases, list) else [])]),
            kind="qa",
            gold_docs=titles,
            source=source,
            metadata={
                "decomposition": _literal(r.get("question_decomposition") or []),
                "answerable": str(r.get("answerable")) == "True",
                "gold_docs_kind": "title",
            },
        ))
    return tasks


def load_nq_open(path: str | Path, *, source: str = "nq-open") -> list[Task]:
    """NQ-open JSONL (``{"question", "answer": [aliases]}``); ids are ``nq-open-<line>``."""
    return [
        Task(task_id=f"{source}-{i}", question=r["question"].strip(), answers=_dedupe(r["answer"]), source=source)
        for i, r in enumerate(_read_jsonl(Path(path)))
    ]


def load_r1_searcher(path: str | Path, *, source: str) -> list[Task]:
    """R1-Searcher JSONL (``{"idx", "question", "answer"}``; answer a string or list)."""
    tasks = []
    for i, r in enumerate(_read_jsonl(Path(path))):
        ans = r.get("answer")
        answers = ans if isinstance(ans, list) else [ans]
        tasks.append(Task(task_id=f"{source}-{r.get('idx', i)}", question=r["question"].strip(),
                          answers=_dedupe(answers), source=source))
    return tasks


def load_deepresearcher(path: str | Path, *, source: str = "deepresearcher") -> list[Task]:
    """DeepResearcher parquet: question in ``prompt[0].content``, aliases in
    ``reward_model.ground_truth`` joined by ``<|answer_split|>``, sub-set in ``data_source``,
    id in ``extra_info.index``."""
    import pandas as pd

    df = pd.read_parquet(path)
    tasks = []
    for i, r in enumerate(df.to_dict("records")):
        prompt = r["prompt"]
        question = prompt[0]["content"] if len(prompt) else ""
        gt = r["reward_model"]["ground_truth"]
        answers = gt.split(ANSWER_SPLIT) if isinstance(gt, str) else [str(x) for x in gt]
        idx = (r.get("extra_info") or {}).get("index") or i
        tasks.append(Task(task_id=f"{source}-{idx}", question=str(question).strip(), answers=_dedupe(answers),
                          source=source, metadata={"data_source": r.get("data_source")}))
    return tasks


def _read_csv(path: Path) -> list[dict[str, str]]:
    csv.field_size_limit(1 << 28)
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def load_simpleqa(path: str | Path, *, source: str = "simpleqa") -> list[Task]:
    """SimpleQA CSV (``metadata`` as a Python-repr dict, ``problem``, ``answer``); the
    metadata's ``urls`` become ``gold_docs`` (``gold_docs_kind="url"``)."""
    tasks = []
    for i, r in enumerate(_read_csv(Path(path))):
        meta = _literal(r.get("metadata") or "{}")
        meta = meta if isinstance(meta, dict) else {}
        tasks.append(Task(task_id=f"{source}-{i}", question=r["problem"].strip(), answers=_dedupe([r["answer"]]),
                          gold_docs=_dedupe(meta.get("urls") or []), source=source,
                          metadata={"topic": meta.get("topic"), "answer_type": meta.get("answer_type"), "gold_docs_kind": "url"}))
    return tasks


def load_frames(path: str | Path, *, source: str = "frames") -> list[Task]:
    """FRAMES CSV as shipped by OpenDeepSearch (``question``, ``true_answer``,
    ``wikipedia_link_*``, ``reasoning_types``); the links become ``gold_docs``."""
    tasks = []
    for i, r in enumerate(_read_csv(Path(path))):
        links = [v.strip() for k, v in r.items() if k and k.startswith("wikipedia_link") and v and v.strip().startswith("http")]
        tasks.append(Task(task_id=f"{source}-{i}", question=r["question"].strip(), answers=_dedupe([r["true_answer"]]),
                          gold_docs=_dedupe(links), source=source,
                          metadata={"reasoning_types": r.get("reasoning_types"), "gold_docs_kind": "url"}))
    return tasks


def load_drb(path: str | Path, *, language: str | None = None, source: str = "drb") -> list[Task]:
    """DeepResearch Bench ``query.jsonl`` (``id``, ``topic``, ``language``, ``prompt``) as
    research tasks; ``language`` (``"en"``/``"zh"``) filters."""
    tasks = []
    for r in _read_jsonl(Path(path)):
        if language is not None and r.get("language") != language:
            continue
        tasks.append(Task(task_id=f"{source}-{r['id']}", question=r["prompt"].strip(), kind="research", source=source,
                          metadata={"topic": r.get("topic"), "language": r.get("language")}))
    return tasks


def load_researchy(queries: str | Path, key_points: str | Path | None = None, *, source: str = "researchy") -> list[Task]:
    """DeepResearchGym Researchy-Questions queries (``{"id", "query"}`` JSONL) with the
    key points of ``key_points_aggregated.jsonl`` (``{"id", "key_points": [{"point_number",
    "point_content", ...}]}``) mapped to ``[{"point": str, "number": int}]``."""
    kp: dict[str, list[dict[str, Any]]] = {}
    if key_points is not None:
        for r in _read_jsonl(Path(key_points)):
            kp[str(r["id"])] = [
                {"point": p.get("point_content", ""), "number": p.get("point_number")}
                for p in r.get("key_points") or []
            ]
    return [
        Task(task_id=f"{source}-{r['id']}", question=r["query"].strip(), kind="research",
             key_points=kp.get(str(r["id"]), []), source=source)
        for r in _read_jsonl(Path(queries))
    ]


BROWSECOMP_PLUS_DIR = "browsecomp-plus"
"""Folder of ``$DRGYM_SHARED_DATA`` holding BrowseComp-Plus (never shipped): the decrypted
queries ``browsecomp_plus_decrypted.jsonl`` and the qrels ``qrel_evidence.txt`` /
``qrel_golds.txt``."""


def _docids(v: Any) -> list[str]:
    """Doc ids of a BrowseComp-Plus ``evidence_docs`` / ``gold_docs`` field (dicts with ``docid``, or ids)."""
    return _dedupe([str(d["docid"]) if isinstance(d, dict) else str(d) for d in (v or [])
                    if not isinstance(d, dict) or d.get("docid") is not None])


def load_browsecomp_plus(path: str | Path, *, evidence_qrels: str | Path | None = None,
                         gold_qrels: str | Path | None = None, source: str = "browsecomp-plus") -> list[Task]:
    """BrowseComp-Plus queries, decrypted (JSONL ``{"query_id", "query", "answer", ...}``).

    BrowseComp-Plus ships its queries encrypted; its decrypt step must have been run first
    (see ``docs/retrieval.md``): a row that still holds a ``canary`` field is refused.
    ``gold_docs`` are the **evidence** documents (every document needed to answer, as
    corpus ``docid``; ``gold_docs_kind="doc_id"``), from ``evidence_qrels`` when given,
    else the row's ``evidence_docs``; ``metadata["answer_docs"]`` are the **gold**
    documents (those holding the answer), from ``gold_qrels`` or the row's ``gold_docs``.
    The question is the raw query: pose it with
    :data:`drgym.rewards.calibration.BROWSECOMP_TEMPLATE` to get the answer-and-confidence format.

    Raises:
        CorpusError: the file is missing, not JSONL, still encrypted, or a row lacks
            ``query_id``, ``query`` or ``answer``; or a qrels file is malformed.
    """

    evidence = read_qrels(evidence_qrels) if evidence_qrels else None
    golds = read_qrels(gold_qrels) if gold_qrels else None
    tasks = []
    for n, r in enumerate(_read_jsonl(Path(path)), 1):
        if not isinstance(r, dict) or "canary" in r:
            raise CorpusError(f"{path}: row {n} is still encrypted (it has a 'canary' field) or not an object: "
                              "run BrowseComp-Plus's decrypt step first (docs/retrieval.md).")
        missing = [k for k in ("query_id", "query", "answer") if k not in r]
        if missing:
            raise CorpusError(f"{path}: row {n} lacks {missing}; decrypted BrowseComp-Plus rows have "
                              "'query_id', 'query' and 'answer'.")
        qid = str(r["query_id"])
        ev = [d for d, rel in evidence.get(qid, {}).items() if rel > 0] if evidence is not None else _docids(r.get("evidence_docs"))
        gd = [d for d, rel in golds.get(qid, {}).items() if rel > 0] if golds is not None else _docids(r.get("gold_docs"))
        tasks.append(Task(task_id=f"{source}-{qid}", question=str(r["query"]).strip(), answers=_dedupe([r["answer"]]),
                          kind="qa", gold_docs=ev, source=source,
                          metadata={"query_id": qid, "answer_docs": gd, "gold_docs_kind": "doc_id"}))
    return tasks


def _browsecomp_plus_shared() -> list[Task]:
    d = shared_data_dir() / BROWSECOMP_PLUS_DIR
    ev, gd = d / "qrel_evidence.txt", d / "qrel_golds.txt"
    return load_browsecomp_plus(_shared(f"{BROWSECOMP_PLUS_DIR}/browsecomp_plus_decrypted.jsonl"),
                                evidence_qrels=ev if ev.exists() else None, gold_qrels=gd if gd.exists() else None)


MAX_QUESTION_CHARS = 100_000
"""Longest question a task file may hold, in characters (about 25k tokens: beyond the
context of the models drgym runs); longer rows are skipped and counted."""

ANSWER_KEYS = ("answer", "answers", "golden_answers")
"""Answer columns looked for, in order, when ``answer_key`` is the default: drgym's
``answer``, and ``answers`` / ``golden_answers`` (Search-R1 and FlashRAG files)."""


def load_hf_tasks(
    path: str | Path,
    *,
    question_key: str = "question",
    answer_key: str | None = "answer",
    id_key: str | None = None,
    kind: str = "qa",
    source: str | None = None,
    split: str = "train",
) -> list[Task]:
    """A user's task file: JSON Lines (read line by line, so errors name the line), or
    any file ``datasets`` can read (json/csv/tsv/parquet, via
    ``datasets.load_dataset(<format>, data_files=path)``).

    Rows that cannot be a task are skipped and counted in one warning naming them
    (``tasks.jsonl: skipped 3 of 40 rows, 37 tasks left: 2 without an answer (lines 4,
    9); ...``; lines of a JSONL file, data rows from 1 of other files):
    no question, no answer (QA), or a question over :data:`MAX_QUESTION_CHARS`
    characters; blank lines of a JSONL file are counted the same way. Task ids are
    ``<source>-<row>`` with rows counted from 0 over the non-blank rows (unchanged by
    skipping), or ``<source>-<id_key value>``.

    Args:
        path: the file.
        question_key: column holding the question or prompt.
        answer_key: column holding the answer (string, list, or ``<|answer_split|>``
            joined aliases); the default ``"answer"`` also finds ``answers`` and
            ``golden_answers`` (:data:`ANSWER_KEYS`); None for research tasks.
        id_key: column with an id (default: row number).
        kind: ``"qa"`` or ``"research"``.
        source: the set name (default: file stem).

    Raises:
        ConfigError: unknown file type, a missing column (the columns found are listed),
            duplicate ids, or no usable row at all.
        CorpusError: the file is not UTF-8 or not JSON (file and line named), or
            ``datasets`` cannot read it.
    """

    path = Path(path)
    fmt = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".tsv": "csv"}.get(path.suffix)
    if fmt is None:
        raise ConfigError(f"Cannot tell the format of {path}: expected .json, .jsonl, .csv, .tsv or .parquet.")
    blank: list[int] = []
    if path.suffix == ".jsonl":
        rows = load_jsonl_strict(path, error=CorpusError, blank_lines=blank)
        # messages name file lines: data row i is the i-th non-blank line
        blank_set = set(blank)
        line_of = [n for n in range(1, len(rows) + len(blank) + 1) if n not in blank_set]
        unit, number = "line", (lambda i: line_of[i])
        bad = [i for i, r in enumerate(rows) if not isinstance(r, dict)]
        if bad:
            raise CorpusError(f"{path}:{number(bad[0])} is a JSON {type(rows[bad[0]]).__name__}, not an object "
                              f"{{\"{question_key}\": ..., \"{answer_key or 'answer'}\": ...}}.")
        columns = list(dict.fromkeys(k for r in rows for k in r))
    else:
        rows, columns = _read_with_datasets(path, fmt, split)
        unit, number = "row", (lambda i: i + 1)  # data rows, from 1
    for key in (question_key, id_key):
        if key is not None and key not in columns:
            raise ConfigError(f"{path} has no column {key!r}; columns: {', '.join(map(str, columns)) or 'none'}.")
    # the default answer column is the first of ANSWER_KEYS a row has (files may mix them)
    answer_keys = [k for k in ANSWER_KEYS if k in columns] if answer_key == "answer" else [answer_key]
    if answer_key is not None and not answer_keys:
        answer_keys = [answer_key]
    if answer_key is not None and answer_keys[0] not in columns:
        wanted = " / ".join(map(repr, ANSWER_KEYS)) if answer_key == "answer" else repr(answer_key)
        raise ConfigError(f"{path} has no answer column {wanted}; columns: {', '.join(map(str, columns)) or 'none'}. "
                          "Every QA task needs its gold answers (research tasks: kind='research').")
    source = source or path.stem
    tasks: list[Task] = []
    skipped: dict[str, list[int]] = {}
    seen_ids: dict[str, int] = {}
    for i, r in enumerate(rows):
        q = r.get(question_key)
        ans: Any = next((r[k] for k in answer_keys if r.get(k) is not None), None) if answer_key else []
        if isinstance(ans, str):
            ans = ans.split(ANSWER_SPLIT)
        elif ans is not None and not isinstance(ans, (list, tuple)):
            ans = [ans]
        answers = _dedupe([a for a in (ans or []) if a is not None])
        if not isinstance(q, str) or not q.strip():
            skipped.setdefault("without a question", []).append(i)
            continue
        if len(q) > MAX_QUESTION_CHARS:
            skipped.setdefault(f"with a question over {MAX_QUESTION_CHARS:,} characters", []).append(i)
            continue
        if answer_key and kind == "qa" and not answers:
            skipped.setdefault("without an answer", []).append(i)
            continue
        tid = f"{source}-{r[id_key] if id_key else i}"
        if tid in seen_ids:
            raise ConfigError(f"{path}: {unit}s {number(seen_ids[tid])} and {number(i)} have the same id {tid!r}; task "
                              "ids must be unique (a rerun resumes by task id).")
        seen_ids[tid] = i
        tasks.append(Task(task_id=tid, question=q.strip(), answers=answers, kind=kind, source=source))  # type: ignore[arg-type]
    n_skipped = sum(len(v) for v in skipped.values())
    if not tasks:
        why = "; ".join(f"{len(v)} {k}" for k, v in skipped.items()) or "the file has no rows"
        raise ConfigError(f"{path} holds no usable task ({why}).")
    if n_skipped or blank:
        parts = [f"{len(v)} {k} ({unit}{'s' if len(v) > 1 else ''} {_rows([number(i) for i in v])})"
                 for k, v in skipped.items()]
        if blank:
            parts.append(f"{len(blank)} blank line{'s' if len(blank) > 1 else ''} ignored "
                         f"(line{'s' if len(blank) > 1 else ''} {_rows(blank)})")
        logging.getLogger(__name__).warning("%s: skipped %d of %d rows, %d task%s left: %s", path, n_skipped, len(rows),
                                            len(tasks), "s" if len(tasks) != 1 else "", "; ".join(parts))
    return tasks


def _rows(numbers: list[int], most: int = 10) -> str:
    """``[3, 8, 9]`` -> ``"3, 8, 9"``; long lists end with ``"... (+n more)"``."""
    head = ", ".join(str(n) for n in numbers[:most])
    return head + (f", ... (+{len(numbers) - most} more)" if len(numbers) > most else "")


def _read_with_datasets(path: Path, fmt: str, split: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows and columns of a json/csv/tsv/parquet file read by ``datasets`` (text files
    are checked for UTF-8 first, so a bad byte is reported by line)."""
    import datasets

    if fmt in ("json", "csv"):
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                decode_line(raw, path, n, error=CorpusError)
    kw = {"delimiter": "\t"} if path.suffix == ".tsv" else {}
    try:
        ds = datasets.load_dataset(fmt, data_files=str(path), split=split, **kw)
    except Exception as e:  # datasets raises its own hierarchy for unreadable files
        cause = e.__cause__ or e
        raise CorpusError(f"Cannot read tasks from {path} as {fmt}: {type(cause).__name__}: {str(cause)[:300]}") from e
    return [dict(r) for r in ds], list(ds.column_names)


# -- name registry ---------------------------------------------------------------------
def _shipped(name: str) -> Path:
    return TASKS_DIR / name


HIPPORAG_SPLIT = "hipporag_split.json"
"""The fixed train/dev/test split of ``hipporag`` (task ids per slice), shipped in
``drgym/data/tasks`` and written by ``scripts/make_hipporag_split.py``."""


def hipporag_split() -> dict[str, list[str]]:
    """Task ids of the fixed ``hipporag`` split: ``{"train": [...], "dev": [...], "test": [...]}``.

    ``test[:20]`` are the main job's questions (``hotpotqa-dev[:20]``); no id is in two
    slices and the three cover the 159 questions (``tests/test_tasks.py`` checks both).

    Raises:
        CorpusError: the shipped split file is missing or malformed.
    """

    p = _shipped(HIPPORAG_SPLIT)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
        return {k: [str(i) for i in d[k]] for k in ("train", "dev", "test")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorpusError(f"the hipporag split file {p} is missing or malformed ({e}); "
                          "rewrite it with python scripts/make_hipporag_split.py.") from e


def _hipporag_slice(name: str) -> list[Task]:
    by_id = {t.task_id: t for t in load_tasks("hipporag")}
    ids = hipporag_split()[name]
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise CorpusError(f"hipporag-{name}: {len(missing)} task ids of {HIPPORAG_SPLIT} are not in hipporag "
                          f"(e.g. {missing[0]!r}).")
    return [by_id[i] for i in ids]


ANSWERABLE_SPLIT = "answerable_split.json"
"""The answerable pool and its frozen split (task records per slice), written by
``scripts/make_answerable_pool.py``."""
ANSWERABLE_TRAIN_WIDE = "answerable_train_wide.json"
ANSWERABLE_TRAIN_WIDE_CAPPED = "answerable_train_wide_capped.json"
"""``answerable-train`` plus the answerable questions of R1-Searcher's training sets
(``scripts/make_answerable_pool.py --wide``)."""
SEARCH_SKILL_POOL = "search_skill_pool.json"
"""Questions whose gold is in the top-10 passages but not in the top-3 observation."""


def shipped_split(file: str, name: str) -> list[Task]:
    """The tasks of slice ``name`` of a shipped split file (``{"slices": {name: [task dicts]}}``).

    Raises:
        CorpusError: the file is missing or malformed, or has no slice ``name``.
    """
    p = _shipped(file)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
        return [Task.from_dict(r) for r in d["slices"][name]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorpusError(f"slice {name!r} of {p} is missing or malformed ({type(e).__name__}: {e}); "
                          "rewrite it with python scripts/make_answerable_pool.py.") from e


SYNTH_DIR = "synth"
"""Questions synthesised from ``wiki-default`` by ``drgym data synth`` (rules generator,
verified in the ``smollm2_answerable_cpu`` env), split by document: ``train.jsonl``,
``dev.jsonl``, ``test.jsonl`` and ``record.json``."""


def load_task_records(path: str | Path) -> list[Task]:
    """Tasks from a JSONL file of :meth:`Task.to_dict` rows (what ``drgym data synth`` writes).

    Raises:
        CorpusError: the file is missing, a line is not JSON, or a row is not a task (named by line).
    """
    rows = load_jsonl_strict(path, error=CorpusError)
    out = []
    for n, r in enumerate(rows, 1):
        try:
            out.append(Task.from_dict(r))
        except (KeyError, TypeError, AttributeError) as e:
            raise CorpusError(f"{path}: row {n} is not a task record ({type(e).__name__}: {e}).") from e
    return out


def unique_questions(*sets: list[Task]) -> list[Task]:
    """The tasks of ``sets`` in order, keeping the first of each question
    (:func:`drgym.rewards.qa.normalize_answer`: lower case, no punctuation or articles)."""
    seen: set[str] = set()
    out = []
    for tasks in sets:
        for t in tasks:
            k = normalize_answer(t.question)
            if k not in seen:
                seen.add(k)
                out.append(t)
    return out


TASK_SETS: dict[str, Callable[[], list[Task]]] = {
    "synth-train": lambda: load_task_records(_shipped(f"{SYNTH_DIR}/train.jsonl")),
    "synth-dev": lambda: load_task_records(_shipped(f"{SYNTH_DIR}/dev.jsonl")),
    "synth-test": lambda: load_task_records(_shipped(f"{SYNTH_DIR}/test.jsonl")),
    "synth-demo": lambda: load_task_records(_shipped(f"{SYNTH_DIR}/demo.jsonl")),
    "breadth-train": lambda: unique_questions(load_tasks("answerable-train-wide-capped"), load_tasks("synth-train")),
    "answerable-train": lambda: shipped_split(ANSWERABLE_SPLIT, "train"),
    "answerable-dev": lambda: shipped_split(ANSWERABLE_SPLIT, "dev"),
    "answerable-test": lambda: shipped_split(ANSWERABLE_SPLIT, "test"),
    "answerable-train-wide": lambda: shipped_split(ANSWERABLE_TRAIN_WIDE, "train"),
    "answerable-train-wide-capped": lambda: shipped_split(ANSWERABLE_TRAIN_WIDE_CAPPED, "train"),
    "search-skill-train": lambda: shipped_split(SEARCH_SKILL_POOL, "train"),
    "search-skill-test": lambda: shipped_split(SEARCH_SKILL_POOL, "test"),
    "hotpotqa-dev": lambda: load_hipporag_hotpotqa(_shipped("hipporag_hotpotqa_train.json")),
    "musique-dev": lambda: load_hipporag_musique(_shipped("hipporag_musique_train.json")),
    "hipporag": lambda: load_tasks("hotpotqa-dev") + load_tasks("musique-dev"),
    "hipporag-train": lambda: _hipporag_slice("train"),
    "hipporag-dev": lambda: _hipporag_slice("dev"),
    "hipporag-test": lambda: _hipporag_slice("test"),
    "nq-open": lambda: load_nq_open(_shipped("nq_open_dev_200.jsonl")),
    "nq-open-full": lambda: load_nq_open(_shared("nq-open/NQ-open.dev.jsonl")),
    "efficientqa-dev": lambda: load_nq_open(_shared("nq-open/NQ-open.efficientqa.dev.1.1.jsonl"),
                                            source="efficientqa-dev"),
    "efficientqa-test": lambda: load_nq_open(_shared("nq-open/NQ-open.efficientqa.test.1.1.jsonl"),
                                             source="efficientqa-test"),
    "bamboogle": lambda: load_r1_searcher(_shipped("r1_bamboogle.jsonl"), source="bamboogle"),
    "r1-hotpotqa": lambda: load_r1_searcher(_shipped("r1_hotpotqa_500.jsonl"), source="r1-hotpotqa"),
    "r1-2wiki": lambda: load_r1_searcher(_shipped("r1_2wiki_500.jsonl"), source="r1-2wiki"),
    "r1-musique": lambda: load_r1_searcher(_shipped("r1_musique_500.jsonl"), source="r1-musique"),
    "r1-stage1": lambda: load_r1_searcher(_shared("r1-searcher/training_set/stage_1.jsonl"), source="r1-stage1"),
    "r1-stage2": lambda: load_r1_searcher(_shipped("r1_stage2.jsonl"), source="r1-stage2"),
    "deepresearcher-dev": lambda: load_deepresearcher(_shipped("deepresearcher_dev.parquet"), source="deepresearcher-dev"),
    "deepresearcher-test": lambda: load_deepresearcher(_shared("deepresearcher/test.parquet"), source="deepresearcher-test"),
    "simpleqa": lambda: load_simpleqa(_shipped("simpleqa_test_100.csv")),
    "simpleqa-full": lambda: load_simpleqa(_shared("simpleqa/simple_qa_test_set.csv")),
    "frames": lambda: load_frames(_shipped("frames_test_50.csv")),
    "frames-full": lambda: load_frames(_shared("frames/frames_test_set.csv")),
    "browsecomp-plus": _browsecomp_plus_shared,
    "drb": lambda: load_drb(_shipped("drb_query.jsonl")),
    "drb-en": lambda: load_drb(_shipped("drb_query.jsonl"), language="en"),
    "drb-zh": lambda: load_drb(_shipped("drb_query.jsonl"), language="zh"),
    "researchy": lambda: load_researchy(
        _shared("deepresearchgym/queries/researchy_queries_sample_doc_click.jsonl"),
        _shared("deepresearchgym/key_points/key_points_aggregated.jsonl"),
    ),
    "researchy-100": lambda: load_researchy(
        _shared("deepresearchgym/queries/researchy_queries_sample_doc_click_100.jsonl"),
        _shared("deepresearchgym/key_points/key_points_aggregated.jsonl"),
    ),
}

_CACHE: dict[str, list[Task]] = {}


def task_set_names() -> list[str]:
    """Names :func:`load_tasks` accepts."""
    return sorted(TASK_SETS)


def load_tasks(name: str, *, limit: int | None = None) -> list[Task]:
    """Load a named task set (see the table in the module docstring), or a file path.

    Results are cached per process; each call returns fresh copies of the list (the Task
    records themselves are shared, treat them as read-only).

    Args:
        name: a registered name, or a path to a ``.json``/``.jsonl``/``.csv``/``.parquet``
            file read with :func:`load_hf_tasks` (``question`` and ``answer`` columns).
        limit: keep the first ``limit`` tasks.

    Raises:
        ConfigError: unknown name (with a "Did you mean" hint), or a task file path that
            does not exist.
        CorpusError: the set is not shipped and ``shared/data`` is absent.
    """
    if name not in TASK_SETS:
        looks_like_file = Path(name).suffix in (".json", ".jsonl", ".csv", ".parquet", ".tsv")
        if looks_like_file and Path(name).exists():
            return load_hf_tasks(name)[:limit]
        if looks_like_file or "/" in name:
            raise ConfigError(f"Task file {name!r} does not exist (a task set is a shipped name, e.g. hotpotqa-dev, "
                              "or an existing .json/.jsonl/.csv/.parquet/.tsv file).")
        raise unknown_name("task set", name, TASK_SETS)
    if name not in _CACHE:
        _CACHE[name] = TASK_SETS[name]()
    tasks = list(_CACHE[name])
    return tasks[:limit] if limit is not None else tasks
