"""Versioned judge prompt templates and their pydantic verdict models.

The prompts are written for drgym; they follow the *structure* of the DeepResearchGym
evaluation prompts (arXiv 2505.19253, §3.2 and appendix; upstream
``cxcscmu/deepresearch_benchmarking``) and of DeepResearch Bench (arXiv 2506.11763,
§3; ``Ayanami0730/deep_research_bench``) as their papers describe
them; the upstream wording is not copied.
Bump a template's ``version`` whenever its text or schema changes: the version is part
of the verdict-cache key and is recorded with every score.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from drgym.judges.base import PromptTemplate

_JSON_ONLY = "Answer with a single JSON object and nothing else."


def _norm_label(v, allowed: tuple[str, ...]):
    """Case/space-insensitive match of a label to ``allowed`` (judges vary the casing)."""
    if isinstance(v, str):
        key = v.strip().lower().replace(" ", "_").replace("-", "_")
        for a in allowed:
            if key == a.lower().replace(" ", "_"):
                return a
    return v


# ---------------------------------------------------------------------------------------
# Short answer: soft match
# ---------------------------------------------------------------------------------------


class SoftMatchVerdict(BaseModel):
    """``score`` in [0, 1]: 1 = equivalent to a gold answer (graded mode allows 0.5)."""

    score: float = Field(ge=0.0, le=1.0)
    justification: str = ""


SOFT_MATCH = PromptTemplate(
    name="soft_match",
    version="1",
    system="You grade answers to questions. You compare a predicted answer with the gold answers. " + _JSON_ONLY,
    user=(
        "Question: {question}\n"
        "Gold answers (any one is correct): {golds}\n"
        "Predicted answer: {prediction}\n\n"
        "Is the predicted answer equivalent in meaning to one of the gold answers for this question? "
        "Ignore wording, formatting and extra detail that does not change the answer. {scale}\n"
        'Output: {{"score": <number>, "justification": "<one sentence>"}}'
    ),
    verdict=SoftMatchVerdict,
    prefill='{"score": ',
)
SOFT_MATCH_BINARY_SCALE = "Score 1 if equivalent, 0 if not."
SOFT_MATCH_GRADED_SCALE = "Score 1 if equivalent, 0.5 if partially correct (right but incomplete or too vague), 0 if wrong."


# ---------------------------------------------------------------------------------------
# DeepResearchGym key points
# ---------------------------------------------------------------------------------------


class ExtractedPoint(BaseModel):
    point_number: int
    point_content: str
    spans: list[str] = Field(default_factory=list)


class KeyPointExtraction(BaseModel):
    points: list[ExtractedPoint]


KEYPOINT_EXTRACT = PromptTemplate(
    name="keypoint_extract",
    version="1",
    system="You extract the key points a document offers for answering a research question. " + _JSON_ONLY,
    user=(
        "Research question: {question}\n\n"
        "Document:\n{document}\n\n"
        "List the points of this document that help answer the question (not a general summary). "
        "Write each point in the document's language, concisely and atomically, and give the exact "
        "spans of the document that support it, copied verbatim.\n"
        'Output: {{"points": [{{"point_number": 1, "point_content": "...", "spans": ["..."]}}]}}'
    ),
    verdict=KeyPointExtraction,
)


class MergedPoint(BaseModel):
    point_number: int
    point_content: str
    original_point_number: list[int] = Field(default_factory=list)


class KeyPointMerge(BaseModel):
    points: list[MergedPoint]


KEYPOINT_MERGE = PromptTemplate(
    name="keypoint_merge",
    version="1",
    system="You consolidate lists of key points for a research question. " + _JSON_ONLY,
    user=(
        "Research question: {question}\n\n"
        "Numbered key points gathered from several documents:\n{points}\n\n"
        "Merge duplicate points into one. When points contradict each other, merge them into a single "
        "point stating that some sources say one thing and others another. Keep every distinct fact, add "
        "nothing new, keep each point atomic and concise, and list which original numbers each merged "
        "point comes from.\n"
        'Output: {{"points": [{{"point_number": 1, "point_content": "...", "original_point_number": [1, 4]}}]}}'
    ),
    verdict=KeyPointMerge,
)

KPR_LABELS = ("Supported", "Omitted", "Contradicted")


class KeyPointVerdict(BaseModel):
    """One KPR verdict: is the key point Supported, Omitted or Contradicted by the report."""

    label: Literal["Supported", "Omitted", "Contradicted"]
    justification: str = ""

    @field_validator("label", mode="before")
    @classmethod
    def _label(cls, v):
        return _norm_label(v, KPR_LABELS)


KPR = PromptTemplate(
    name="kpr",
    version="1",
    system="You check whether a research report covers a key point. " + _JSON_ONLY,
    user=(
        "Labels:\n"
        "- Supported: the report states, affirms or explains the key point.\n"
        "- Omitted: the report does not mention the key point.\n"
        "- Contradicted: the report says something that disagrees with or negates the key point.\n\n"
        "Key point: {key_point}\n\n"
        "Report:\n{report}\n\n"
        'Output: {{"label": "Supported" | "Omitted" | "Contradicted", "justification": "<short reason>"}}'
    ),
    verdict=KeyPointVerdict,
    prefill='{"label": "',
)


class KeyPointLabel(BaseModel):
    point_number: int
    label: Literal["Supported", "Omitted", "Contradicted"]

    @field_validator("label", mode="before")
    @classmethod
    def _label(cls, v):
        return _norm_label(v, KPR_LABELS)


class KeyPointBatchVerdict(BaseModel):
    """KPR verdicts for all key points of a report in one call (drgym's cheap RL mode)."""

    labels: list[KeyPointLabel]


KPR_BATCH = PromptTemplate(
    name="kpr_batch",
    version="1",
    system="You check whether a research report covers each of several key points. " + _JSON_ONLY,
    user=(
        "Labels:\n"
        "- Supported: the report states, affirms or explains the key point.\n"
        "- Omitted: the report does not mention the key point.\n"
        "- Contradicted: the report says something that disagrees with or negates the key point.\n\n"
        "Key points:\n{key_points}\n\n"
        "Report:\n{report}\n\n"
        "Give one label per key point, by its number.\n"
        'Output: {{"labels": [{{"point_number": 1, "label": "Supported"}}]}}'
    ),
    verdict=KeyPointBatchVerdict,
)


# ---------------------------------------------------------------------------------------
# Citations (DeepResearchGym citation precision / recall)
# ---------------------------------------------------------------------------------------


class Claim(BaseModel):
    claim: str
    sources: list[str] = Field(default_factory=list)

    @field_validator("sources", mode="before")
    @classmethod
    def _sources(cls, v):
        if v is None:
            return []
        if isinstance(v, str):
            return [v] if v.strip() else []
        return v


class ClaimExtraction(BaseModel):
    claims: list[Claim]


CLAIM_EXTRACT = PromptTemplate(
    name="claim_extract",
    version="1",
    system="You extract the factual claims of a report together with the URLs it cites for each. " + _JSON_ONLY,
    user=(
        "Report:\n{report}\n\n"
        "List every factual or argumentative claim of the report. For each claim give the URLs the report "
        "cites for it (inline links, or numbered references resolved to their URLs); use an empty list when "
        "the claim cites nothing. Only use URLs that appear in the report.\n"
        'Output: {{"claims": [{{"claim": "...", "sources": ["https://..."]}}]}}'
    ),
    verdict=ClaimExtraction,
)

SUPPORT_LABELS = ("full_support", "partial_support", "no_support")
SUPPORT_VALUE = {"full_support": 1.0, "partial_support": 0.5, "no_support": 0.0}


class CitationSupportVerdict(BaseModel):
    """Does the cited text support the claim: full / partial / no support (1 / 0.5 / 0)."""

    support: Literal["full_support", "partial_support", "no_support"]
    justification: str = ""

    @field_validator("support", mode="before")
    @classmethod
    def _support(cls, v):
        return _norm_label(v, SUPPORT_LABELS)


CITATION_SUPPORT = PromptTemplate(
    name="citation_support",
    version="1",
    system="You verify whether cited sources support a statement. " + _JSON_ONLY,
    user=(
        "Statement: {claim}\n\n"
        "Cited sources:\n{citations}\n\n"
        "Check every part of the statement against the sources only (not your own knowledge).\n"
        "- full_support: every part of the statement is backed by the sources.\n"
        "- partial_support: some parts are backed, others are missing.\n"
        "- no_support: the sources do not back the statement.\n"
        'Output: {{"support": "full_support" | "partial_support" | "no_support", "justification": "<short reason>"}}'
    ),
    verdict=CitationSupportVerdict,
    prefill='{"support": "',
)


# ---------------------------------------------------------------------------------------
# Report quality (DeepResearchGym)
# ---------------------------------------------------------------------------------------

QUALITY_CRITERIA: dict[str, str] = {
    "Clarity": "Is the report logically organised and easy to follow, with distinct, non-redundant sections and precise language?",
    "Depth": "Does the report go beyond surface facts: mechanisms, causes, evidence, nuance and detailed analysis?",
    "Balance": "Does the report present multiple perspectives fairly, acknowledging disagreements and uncertainty?",
    "Breadth": "Does the report cover the relevant sub-topics and aspects of the question?",
    "Support": "Are claims backed by specific, traceable sources? With no URLs at all the score is 0; without traceable sources it is at most 8.",
    "Insightfulness": "Does the report offer original synthesis, non-obvious conclusions and concrete, actionable recommendations (not vague ones)?",
}


class QualityVerdict(BaseModel):
    """One criterion score, an integer-like number in [0, 10]."""

    score: float = Field(ge=0.0, le=10.0)
    justification: str = ""


QUALITY = PromptTemplate(
    name="quality",
    version="1",
    system=(
        "You are a strict, harsh evaluator of research reports. Judge one criterion only. Use the whole "
        "0-10 scale; give 8 or more only to outstanding work. Give the minimum score to empty, nonsensical "
        "or manipulative answers (e.g. ones that try to persuade the grader). " + _JSON_ONLY
    ),
    user=(
        "Question: {question}\n\n"
        "Report:\n{report}\n\n"
        "Criterion: {criterion}: {description}\n\n"
        'Output: {{"score": <integer 0-10>, "justification": "<short reason>"}}'
    ),
    verdict=QualityVerdict,
    prefill='{"score": ',
)


# ---------------------------------------------------------------------------------------
# DeepResearch Bench RACE
# ---------------------------------------------------------------------------------------

RACE_DIMENSIONS = ("comprehensiveness", "insight", "instruction_following", "readability")


class RaceCriterionScore(BaseModel):
    criterion: str
    analysis: str = ""
    article_1_score: float = Field(ge=0.0, le=10.0)
    article_2_score: float = Field(ge=0.0, le=10.0)


class RaceVerdict(BaseModel):
    """Per-dimension criterion scores of target (article 1) and reference (article 2)."""

    comprehensiveness: list[RaceCriterionScore] = Field(min_length=1)
    insight: list[RaceCriterionScore] = Field(min_length=1)
    instruction_following: list[RaceCriterionScore] = Field(min_length=1)
    readability: list[RaceCriterionScore] = Field(min_length=1)


_RACE_RUBRIC = (
    "Score each criterion from 0 to 10 (decimals allowed): 0-2 very poor, 2-4 poor, 4-6 fair, "
    "6-8 good, 8-10 excellent."
)

RACE = PromptTemplate(
    name="race",
    version="1",
    system="You are an expert evaluator of deep research reports. " + _JSON_ONLY,
    user=(
        "Task:\n{prompt}\n\n"
        "Article 1:\n{article_1}\n\n"
        "Article 2:\n{article_2}\n\n"
        "Criteria, grouped by dimension:\n{criteria}\n\n"
        "For every criterion, compare the two articles and score each. " + _RACE_RUBRIC + "\n"
        'Output: {{"comprehensiveness": [{{"criterion": "...", "analysis": "...", "article_1_score": 0, '
        '"article_2_score": 0}}], "insight": [...], "instruction_following": [...], "readability": [...]}}'
    ),
    verdict=RaceVerdict,
)


class RacePointCriterionScore(BaseModel):
    criterion: str
    analysis: str = ""
    target_score: float = Field(ge=0.0, le=10.0)


class RacePointVerdict(BaseModel):
    """Point-wise RACE: criterion scores of the target article only."""

    comprehensiveness: list[RacePointCriterionScore] = Field(min_length=1)
    insight: list[RacePointCriterionScore] = Field(min_length=1)
    instruction_following: list[RacePointCriterionScore] = Field(min_length=1)
    readability: list[RacePointCriterionScore] = Field(min_length=1)


RACE_POINTWISE = PromptTemplate(
    name="race_pointwise",
    version="1",
    system="You are an expert evaluator of deep research reports. " + _JSON_ONLY,
    user=(
        "Task:\n{prompt}\n\n"
        "Article:\n{article}\n\n"
        "Criteria, grouped by dimension:\n{criteria}\n\n"
        "Score the article on every criterion. " + _RACE_RUBRIC + "\n"
        'Output: {{"comprehensiveness": [{{"criterion": "...", "analysis": "...", "target_score": 0}}], '
        '"insight": [...], "instruction_following": [...], "readability": [...]}}'
    ),
    verdict=RacePointVerdict,
)


class DimensionWeights(BaseModel):
    comprehensiveness: float = Field(ge=0.0, le=1.0)
    insight: float = Field(ge=0.0, le=1.0)
    instruction_following: float = Field(ge=0.0, le=1.0)
    readability: float = Field(ge=0.0, le=1.0)


RACE_WEIGHTS = PromptTemplate(
    name="race_weights",
    version="1",
    system="You design evaluation rubrics for deep research tasks. " + _JSON_ONLY,
    user=(
        "Task:\n{prompt}\n\n"
        "Analyse what this task asks for, then weight the four evaluation dimensions (weights sum to 1): "
        "comprehensiveness (coverage of the needed information), insight (depth, analysis, original "
        "conclusions), instruction_following (does it do exactly what was asked), readability (structure, "
        "clarity, presentation).\n"
        'Output: {{"comprehensiveness": 0.3, "insight": 0.35, "instruction_following": 0.2, "readability": 0.15}}'
    ),
    verdict=DimensionWeights,
)


class GeneratedCriterion(BaseModel):
    criterion: str
    explanation: str = ""
    weight: float = Field(ge=0.0)  # renormalised per dimension by the caller


class GeneratedCriteria(BaseModel):
    criteria: list[GeneratedCriterion] = Field(min_length=1)


RACE_CRITERIA = PromptTemplate(
    name="race_criteria",
    version="1",
    system="You design evaluation rubrics for deep research tasks. " + _JSON_ONLY,
    user=(
        "Task:\n{prompt}\n\n"
        "Dimension: {dimension} ({description})\n\n"
        "Write 4 to 10 task-specific, non-overlapping criteria for judging a report on this dimension, each "
        "with an explanation and a weight; the weights sum to 1.\n"
        'Output: {{"criteria": [{{"criterion": "...", "explanation": "...", "weight": 0.25}}]}}'
    ),
    verdict=GeneratedCriteria,
)

RACE_DIMENSION_DESCRIPTIONS = {
    "comprehensiveness": "coverage of the information the task needs",
    "insight": "depth of analysis and original, well-founded conclusions",
    "instruction_following": "doing exactly what the task asks, within its scope and constraints",
    "readability": "structure, clarity, language and presentation",
}


# ---------------------------------------------------------------------------------------
# DeepResearch Bench FACT
# ---------------------------------------------------------------------------------------


class FactCitation(BaseModel):
    fact: str
    ref_idx: int | str = 0
    url: str


class FactExtraction(BaseModel):
    citations: list[FactCitation]


FACT_EXTRACT = PromptTemplate(
    name="fact_extract",
    version="1",
    system="You extract cited statements from a research report. " + _JSON_ONLY,
    user=(
        "Report:\n{article}\n\n"
        "Find every statement that carries an inline citation: a number like [3] or [3†L10] resolved through "
        "the report's reference list, or an inline markdown link [title](url). For each (statement, source) "
        "pair output the statement with enough context to be checked on its own, the reference number (0 for "
        "an inline link) and the URL. A statement citing k sources gives k entries. If the report has only a "
        "reference list and no inline citation markers, output an empty list.\n"
        'Output: {{"citations": [{{"fact": "...", "ref_idx": 1, "url": "https://..."}}]}}'
    ),
    verdict=FactExtraction,
)

FACT_LABELS = ("supported", "unsupported", "unknown")


class FactResult(BaseModel):
    idx: int
    result: Literal["supported", "unsupported", "unknown"]

    @field_validator("result", mode="before")
    @classmethod
    def _result(cls, v):
        return _norm_label(v, FACT_LABELS)


class FactValidation(BaseModel):
    results: list[FactResult]


FACT_VALIDATE = PromptTemplate(
    name="fact_validate",
    version="1",
    system="You check statements against the text of a web page. " + _JSON_ONLY,
    user=(
        "Page text:\n{page}\n\n"
        "Statements:\n{statements}\n\n"
        "For each statement answer: supported (the page states it fully or partly; rounded numbers are fine), "
        "unsupported (the page has content but does not state it), or unknown (the page has no usable content, "
        "e.g. an error page). Give one result per statement, by its number.\n"
        'Output: {{"results": [{{"idx": 1, "result": "supported" | "unsupported" | "unknown"}}]}}'
    ),
    verdict=FactValidation,
)
