"""Questions from a corpus, kept only when retrieval verifies them, split by document.

The pipeline behind ``drgym data synth`` (S3-R1 / SSP-style corpus-grounded synthesis):

1. **generate**: a generator (the rules of :mod:`drgym.synth.rules`, or a teacher model,
   :mod:`drgym.synth.teacher`) writes ``(question, answer, evidence doc_id)`` candidates
   from each passage;
2. **filter**: drop a candidate whose answer is in its question (SQuAD-normalised, on word
   boundaries: :func:`drgym.rewards.qa.cover_exact_match`), or whose question is held out
   (equal after normalisation to a question of a test set) or already seen;
3. **verify**: run the env itself, at its exact settings, with the question as the query
   (``<search>QUESTION</search>`` through :class:`~drgym.envs.driver.BatchedDriver`): a
   candidate is kept only when a gold alias is in the observation the env shows. The
   evidence passage's rank in the backend's top ``full_k`` is recorded as its
   difficulty (``evidence_rank``, 1-based; None when below ``full_k``);
4. **cap**: at most ``max_per_answer`` questions per answer string (the first alias,
   normalised), so a frequent answer cannot be earned by a constant policy;
5. **split by document**: a document's questions all go to one slice, by a seeded hash of
   its doc_id (``test_frac``, ``dev_frac``, ``demo_frac``); documents the env shows for a held-out test
   question go to no slice at all, so no test question's evidence is trained on.

Every count kept and dropped at each stage is in :attr:`SynthResult.record`.
"""

from __future__ import annotations

import hashlib
import logging
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from drgym.envs.driver import BatchedDriver
from drgym.envs.prompts import shown_text
from drgym.errors import ConfigError
from drgym.records import Task
from drgym.rewards.evidence import gold_aliases, gold_in_view
from drgym.rewards.qa import cover_exact_match, normalize_answer
from drgym.synth.rules import Candidate, rule_questions
from drgym.types import Document

logger = logging.getLogger(__name__)

Generator = Callable[[Sequence[Document]], list[Candidate]]
"""Passages in, candidates out (see :func:`drgym.synth.rules.rule_questions`)."""

VERIFY_FAILURE_LIMIT = 0.01
"""Share of verification searches that may fail (backend errors) before the run stops."""


@dataclass(frozen=True)
class SynthSettings:
    """Settings of one synthesis run (all recorded).

    Attributes:
        seed: seeds the document split and the order of the output.
        test_frac: share of documents whose questions form the synthetic test slice.
        dev_frac: share of documents whose questions form the dev slice.
        demo_frac: share of documents whose questions form the ``demo`` slice (a fixed
            showcase, such as ``drgym rollout``'s default tasks: neither trained on nor used
            for settings or final figures).
        max_per_answer: most questions kept per answer string.
        full_k: depth of the evidence-rank search.
        batch: envs stepped together (one ``search_batch`` per step).
        max_verify: verify at most this many candidates (None: all), in seeded order.
    """

    seed: int = 20261207
    test_frac: float = 0.06
    dev_frac: float = 0.02
    demo_frac: float = 0.0
    max_per_answer: int = 3
    full_k: int = 10
    batch: int = 64
    max_verify: int | None = None

    def __post_init__(self) -> None:
        fracs = (self.test_frac, self.dev_frac, self.demo_frac)
        if not (all(0 <= f < 1 for f in fracs) and sum(fracs) < 1):
            raise ConfigError(f"test_frac, dev_frac and demo_frac must be in [0, 1) with a sum below 1, got "
                              f"{self.test_frac}, {self.dev_frac} and {self.demo_frac}.")
        if self.max_per_answer < 1 or self.full_k < 1 or self.batch < 1:
            raise ConfigError("max_per_answer, full_k and batch must be >= 1.")


@dataclass
class SynthResult:
    """What :func:`synthesize` made.

    Attributes:
        slices: ``{"train": [Task], "dev": [Task], "test": [Task]}`` (and ``"demo"`` when
            ``demo_frac`` is set); each task's
            ``gold_docs`` is ``[evidence doc_id]`` and its metadata holds ``rule``,
            ``answer_type``, ``evidence_rank`` and ``evidence_shown``.
        record: counts per stage, per rule and per answer type, settings, seconds.
    """

    slices: dict[str, list[Task]]
    record: dict[str, Any] = field(default_factory=dict)


def doc_bucket(doc_id: str, seed: int) -> float:
    """A document's place in [0, 1): a seeded SHA-256 of its id, the same on every machine.

    >>> round(doc_bucket("ovos-00001", 1), 6) == round(doc_bucket("ovos-00001", 1), 6)
    True
    """
    h = hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def slice_of(doc_id: str, settings: SynthSettings) -> str:
    """``"test"``, ``"dev"``, ``"demo"`` or ``"train"`` for a document (by :func:`doc_bucket`)."""
    b = doc_bucket(doc_id, settings.seed)
    if b < settings.test_frac:
        return "test"
    if b < settings.test_frac + settings.dev_frac:
        return "dev"
    if b < settings.test_frac + settings.dev_frac + settings.demo_frac:
        return "demo"
    return "train"


def _base_doc(doc_id: str) -> str:
    """The document of a passage id (``"<doc_id>#p<k>"`` -> ``doc_id``)."""
    return doc_id.split("#p", 1)[0]


def shown_docs(env_factory: Callable[[], Any], questions: Sequence[str], *, batch: int = 64) -> list[list[str]]:
    """The document ids each question's observation shows, searching the question through the env.

    Raises:
        RuntimeError: a search failed (a held-out guard must not be partial).
    """
    out: list[list[str]] = []
    for obs, infos in env_search(env_factory, [Task(task_id=f"q{i}", question=q) for i, q in enumerate(questions)],
                                  batch=batch):
        if infos.get("error"):
            raise RuntimeError(f"search failed while listing held-out documents: {infos['error']}")
        out.append([_base_doc(str(r.get("doc_id", ""))) for r in infos.get("results") or []])
    return out


def env_search(env_factory: Callable[[], Any], tasks: Sequence[Task], *, batch: int):
    """Yield ``(observation, info)`` of ``<search>QUESTION</search>`` for each task, in order,
    stepping ``batch`` envs together (one ``search_batch`` per ``batch`` questions).

    Args:
        env_factory: makes the env (all share its backend).
        tasks: the questions, as tasks (their golds only reach the env's reward).
        batch: envs stepped together.
    """
    envs = [env_factory() for _ in range(min(batch, max(1, len(tasks))))]
    with BatchedDriver(envs) as driver:
        for start in range(0, len(tasks), len(envs)):
            chunk = tasks[start:start + len(envs)]
            driver.reset(options=[{"task": t} for t in chunk] + [None] * (len(envs) - len(chunk)))
            res = driver.step({i: f"<search>{t.question}</search>" for i, t in enumerate(chunk)})
            for i in range(len(chunk)):
                obs, _, _, _, info = res[i]
                yield obs, info


def synthesize(
    docs: Iterable[Document],
    generator: Generator,
    env_factory: Callable[[], Any],
    *,
    settings: SynthSettings = SynthSettings(),
    held_out_questions: Iterable[str] = (),
    held_out_docs: Iterable[str] = (),
    describe: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> SynthResult:
    """Generate, filter, verify, cap and split questions (the module docstring's five steps).

    Args:
        docs: the passages to write questions from (a corpus, or a sample of one).
        generator: candidates from passages (:func:`drgym.synth.rules.rule_questions`
            wrapped by :func:`rules_generator`, or a teacher).
        env_factory: makes the env whose observation verifies a question (same corpus,
            method, ``top_k`` and ``max_obs_tokens`` as training).
        settings: see :class:`SynthSettings`.
        held_out_questions: test questions: a candidate equal to one after normalisation
            is dropped.
        held_out_docs: doc_ids that no slice may use (the documents shown for test questions).
        describe: generator and engine descriptions for the record.
        progress: called with a line now and then.

    Returns:
        A :class:`SynthResult`.

    Raises:
        RuntimeError: more than :data:`VERIFY_FAILURE_LIMIT` of the verification searches failed.
    """
    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    held_q = {normalize_answer(q) for q in held_out_questions}
    held_d = {_base_doc(d) for d in held_out_docs}
    docs = list(docs)
    stages: Counter = Counter()
    stages["documents"] = len(docs)
    cands = generator(docs)
    stages["generated"] = len(cands)
    by_rule_generated = Counter(c.rule for c in cands)
    kept: list[Candidate] = []
    seen_q: set[str] = set()
    for c in cands:
        nq = normalize_answer(c.question)
        golds = gold_aliases(c.answers)
        if _base_doc(c.doc_id) in held_d:
            stages["dropped_held_out_document"] += 1
        elif not golds:
            stages["dropped_no_answer"] += 1
        elif cover_exact_match(c.question, golds):
            stages["dropped_answer_in_question"] += 1
        elif nq in held_q:
            stages["dropped_held_out_question"] += 1
        elif not nq or nq in seen_q:
            stages["dropped_duplicate_question"] += 1
        else:
            seen_q.add(nq)
            kept.append(c)
    # a seeded order, so --max-verify samples every rule and the cap keeps no file-order bias
    kept.sort(key=lambda c: doc_bucket(f"{c.doc_id}|{c.question}", settings.seed + 1))
    if settings.max_verify is not None:
        stages["not_verified_max_verify"] = max(0, len(kept) - settings.max_verify)
        kept = kept[: settings.max_verify]
    stages["checked"] = len(kept)
    say(f"{len(cands)} candidates from {len(docs)} documents; verifying {len(kept)}")

    tasks = [Task(task_id=f"synth-{i}", question=c.question, answers=list(c.answers)) for i, c in enumerate(kept)]
    verified: list[tuple[Candidate, bool]] = []
    failures = 0
    for i, (obs, info) in enumerate(env_search(env_factory, tasks, batch=settings.batch)):
        c = kept[i]
        if info.get("error"):
            failures += 1
            continue
        shown = [_base_doc(str(r.get("doc_id", ""))) for r in info.get("results") or []]
        if gold_in_view(shown_text(obs), c.answers):
            verified.append((c, c.doc_id in shown))
        if progress and (i + 1) % 2000 == 0:
            say(f"  verified {i + 1}/{len(kept)}: {len(verified)} in view, {time.perf_counter() - t0:.0f} s")
    stages["verify_failed"] = failures
    if kept and failures / len(kept) > VERIFY_FAILURE_LIMIT:
        raise RuntimeError(f"{failures} of {len(kept)} verification searches failed; the backend is not healthy.")
    stages["dropped_not_in_view"] = len(kept) - failures - len(verified)
    stages["in_view"] = len(verified)

    # evidence rank: the passage's rank in the backend's top full_k for the question
    backend = env_factory().backend
    ranks: list[int | None] = []
    qs = [c.question for c, _ in verified]
    for s in range(0, len(qs), 256):
        for c_hits in backend.search_batch(qs[s:s + 256], k=settings.full_k):
            ranks.append(None)
            for h in c_hits:
                if _base_doc(h.doc_id) == verified[len(ranks) - 1][0].doc_id:
                    ranks[-1] = h.rank
                    break

    per_answer: Counter = Counter()
    slices: dict[str, list[Task]] = {"train": [], "dev": [], "test": []}
    if settings.demo_frac:
        slices["demo"] = []
    for (c, ev_shown), rank in zip(verified, ranks):
        key = normalize_answer(c.answers[0])
        per_answer[key] += 1
        if per_answer[key] > settings.max_per_answer:
            stages["dropped_answer_cap"] += 1
            continue
        name = slice_of(c.doc_id, settings)
        n = len(slices[name])
        slices[name].append(Task(
            task_id=f"synth-{name}-{n:05d}", question=c.question, answers=list(c.answers), gold_docs=[c.doc_id],
            source="synth", metadata={"rule": c.rule, "answer_type": c.answer_type, "evidence_rank": rank,
                                      "evidence_shown": ev_shown, "gold_docs_kind": "doc_id", **c.metadata}))
    for name, rows in slices.items():
        stages[f"kept_{name}"] = len(rows)
    record = {
        "describe": describe or {},
        "settings": {k: getattr(settings, k) for k in settings.__dataclass_fields__},
        "stages": dict(stages),
        "generated_by_rule": dict(by_rule_generated),
        "kept_by_rule": {n: dict(Counter(t.metadata["rule"] for t in rows)) for n, rows in slices.items()},
        "answer_types": {n: dict(Counter(t.metadata["answer_type"] for t in rows)) for n, rows in slices.items()},
        "evidence_rank": {n: dict(Counter(str(t.metadata["evidence_rank"]) for t in rows)) for n, rows in slices.items()},
        "evidence_shown_frac": {n: round(sum(t.metadata["evidence_shown"] for t in rows) / max(1, len(rows)), 4)
                                for n, rows in slices.items()},
        "documents_per_slice": {n: len({t.gold_docs[0] for t in rows}) for n, rows in slices.items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return SynthResult(slices=slices, record=record)


def rules_generator(docs: Sequence[Document]) -> list[Candidate]:
    """The deterministic generator over many passages (:func:`drgym.synth.rules.rule_questions`)."""

    return [c for d in docs for c in rule_questions(d)]


def question_profile(questions: Sequence[str], answers: Sequence[str]) -> dict[str, Any]:
    """How a question set reads: length, first word, answer kind (for the NQ comparison table).

    Returns:
        ``{"n", "words_mean", "words_median", "question_word": {word: share},
        "answer_kind": {"year/date": share, "number": share, "name or phrase": share},
        "answer_words_mean"}``.
    """

    n = len(questions)
    if not n:
        return {"n": 0}
    lens = [len(q.split()) for q in questions]
    first = Counter()
    for q in questions:
        w = q.split()[0].lower().strip("?,") if q.split() else ""
        first[w if w in {"what", "who", "when", "where", "which", "how", "in", "why"} else "other"] += 1
    kinds = Counter()
    for a in answers:
        a = str(a).strip()
        if re.fullmatch(r"(?:\d{1,2} )?(?:[A-Z][a-z]+ )?(?:\d{1,2},? )?\d{3,4}", a):
            kinds["year/date"] += 1
        elif re.fullmatch(r"[\d.,]+(?: \w+)?", a):
            kinds["number"] += 1
        else:
            kinds["name or phrase"] += 1
    return {
        "n": n,
        "words_mean": round(sum(lens) / n, 2),
        "words_median": statistics.median(lens),
        "question_word": {k: round(v / n, 3) for k, v in first.most_common()},
        "answer_kind": {k: round(v / n, 3) for k, v in kinds.most_common()},
        "answer_words_mean": round(sum(len(str(a).split()) for a in answers) / n, 2),
    }
