"""Write qrels and queries for the HippoRAG questions over the ``wiki-default`` corpus.

    python scripts/make_hipporag_qrels.py        # writes the two files below

* ``drgym/data/tasks/hipporag_qrels.txt``: TREC qrels, ``qid 0 doc_id 1``, one line per
  supporting paragraph of each question;
* ``drgym/data/tasks/hipporag_queries.tsv``: ``qid<TAB>question``.

The qids are the task ids of ``hotpotqa-dev`` and ``musique-dev`` (the 159 questions of
``hipporag``). A supporting paragraph is HotpotQA's ``supporting_facts`` title with its
context paragraph, or a MuSiQue paragraph with ``is_supporting`` true; it is matched to
the ``wiki-default`` document with the same title and text (whitespace collapsed,
lower-cased), the key ``scripts/bench_search.py`` uses. Judgements are at **document
level**: ``doc_id`` is a document of the corpus (each HippoRAG paragraph is one document;
the index may split a long one into passages, which evaluation collapses back).

Titles alone would not do: 470 titles of ``wiki-default`` name more than one document.
A paragraph that matches no document, or more than one, stops the script with its
question and title named.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "drgym" / "data" / "tasks"
QRELS = TASKS / "hipporag_qrels.txt"
QUERIES = TASKS / "hipporag_queries.tsv"


def norm(s: str) -> str:
    """Whitespace collapsed and lower-cased: the matching key of a paragraph."""
    return re.sub(r"\s+", " ", s).strip().lower()


def supporting_paragraphs() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """``(task_id, question, [(title, text), ...])`` per question, hotpotqa-dev then musique-dev."""
    from drgym.envs.task_loaders import load_tasks

    out = []
    hp = json.loads((TASKS / "hipporag_hotpotqa_train.json").read_text(encoding="utf-8"))
    for task, r in zip(load_tasks("hotpotqa-dev"), hp, strict=True):
        assert task.task_id == f"hotpotqa-{r['_id']}", (task.task_id, r["_id"])
        ctx = {t: "".join(s) for t, s in r["context"]}
        titles = list(dict.fromkeys(t for t, _ in r["supporting_facts"]))
        out.append((task.task_id, task.question, [(t, ctx[t]) for t in titles]))
    mu = json.loads((TASKS / "hipporag_musique_train.json").read_text(encoding="utf-8"))
    for task, r in zip(load_tasks("musique-dev"), mu, strict=True):
        assert task.task_id == f"musique-{r['id']}", (task.task_id, r["id"])
        out.append((task.task_id, task.question,
                    [(p["title"], p["paragraph_text"]) for p in r["paragraphs"] if p["is_supporting"]]))
    return out


def main() -> int:
    from drgym.corpus.named import load_named_corpus
    from drgym.evaluation.retrieval import write_qrels

    by_key: dict[tuple[str, str], list[str]] = {}
    for d in load_named_corpus("wiki-default"):
        by_key.setdefault((norm(d.title), norm(d.text)), []).append(d.doc_id)
    qrels: dict[str, dict[str, int]] = {}
    lines = []
    for qid, question, paras in supporting_paragraphs():
        if not paras:
            sys.exit(f"{qid}: no supporting paragraph")
        for title, text in paras:
            ids = by_key.get((norm(title), norm(text)), [])
            if len(ids) != 1:
                sys.exit(f"{qid}: supporting paragraph {title!r} matches {len(ids)} wiki-default documents, not 1")
            qrels.setdefault(qid, {})[ids[0]] = 1
        lines.append(f"{qid}\t{' '.join(question.split())}\n")
    write_qrels(QRELS, qrels)
    from drgym.atomic import atomic_write_text

    atomic_write_text(QUERIES, "".join(lines))
    n = sum(len(v) for v in qrels.values())
    print(f"wrote {QRELS.relative_to(REPO)} ({len(qrels)} queries, {n} judgements) and {QUERIES.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
