"""The deterministic question generator: rules over a passage's title, text and description.

No model is needed, so it runs on any CPU in seconds for 10^4 passages. Each rule reads
the **lead sentence** of a passage (Wikipedia-style: ``"Title (born 1 May 1950) is an
American actor..."``) and writes questions that a person would ask of it, NQ-style:

===================  ==========================================  ==============================
rule                 example question                            answer (answer type)
===================  ==========================================  ==============================
``born``             When was Hassan Al-Qeed born?               13 April 1998 (date)
``died``             When did Eduardo De Filippo die?            31 October 1984 (date)
``birthplace``       Where was X born?                           Boston, Massachusetts (place)
``nationality``      What nationality was Eduardo De Filippo?    Italian (nationality)
``work_year``        In what year was the film X released?       2013 (year)
``made_by``          Who directed the 2013 film Forbidden Ground? Earl (person)
``founded``          When was Enterprise Holdings founded?       2009 (year)
``founder``          Who founded X?                              (person)
``headquarters``     Where is Enterprise Holdings headquartered? Clayton, Missouri (place)
``location``         Where is Sloothby located?                  East Lindsey district ... (place)
``capital_of``       Berlin is the capital of which country?     Germany (place)
``team``             Which team does X play for?                 Al-Shabab (organisation)
``family``           To which family does X belong?              Dasyuridae (taxon)
``definition``       What is a head covering worn for various     Hat (entity: the title)
                     reasons, including protection against
                     weather conditions?
``description``      What is the shaped head covering called?    Hat (entity: the title)
===================  ==========================================  ==============================

A rule that does not match writes nothing; no rule guesses. Answers are cut at the first
comma, semicolon or clause word and kept only when they are 1-10 words; a place answer
``"Clayton, Missouri"`` also gets the alias ``"Clayton"``, a date also its year. Whether
the question is *answerable* is not decided here: :mod:`drgym.synth.pipeline` keeps a
question only when retrieval shows its answer for the question as the query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from drgym.types import Document

DEMONYMS = frozenset("""
Afghan Albanian Algerian American Andorran Angolan Argentine Argentinian Armenian Australian Austrian
Azerbaijani Bahamian Bahraini Bangladeshi Barbadian Belarusian Belgian Belizean Beninese Bhutanese Bolivian
Bosnian Botswanan Brazilian British Bruneian Bulgarian Burmese Burundian Cambodian Cameroonian Canadian
Chadian Chilean Chinese Colombian Congolese Croatian Cuban Cypriot Czech Danish Dominican Dutch Ecuadorian
Egyptian English Eritrean Estonian Ethiopian Fijian Filipino Finnish French Gabonese Gambian Georgian German
Ghanaian Greek Guatemalan Guinean Haitian Honduran Hungarian Icelandic Indian Indonesian Iranian Iraqi Irish
Israeli Italian Ivorian Jamaican Japanese Jordanian Kazakh Kenyan Korean Kosovar Kuwaiti Kyrgyz Laotian
Latvian Lebanese Liberian Libyan Lithuanian Luxembourgish Macedonian Malagasy Malawian Malaysian Maldivian
Malian Maltese Mauritanian Mauritian Mexican Moldovan Mongolian Montenegrin Moroccan Mozambican Namibian
Nepalese Nigerian Nigerien Norwegian Omani Pakistani Palestinian Panamanian Paraguayan Persian Peruvian Polish
Portuguese Qatari Romanian Russian Rwandan Salvadoran Samoan Saudi Scottish Senegalese Serbian Singaporean
Slovak Slovenian Somali South-African Spanish Sudanese Surinamese Swazi Swedish Swiss Syrian Taiwanese Tajik
Tanzanian Thai Togolese Tongan Tunisian Turkish Turkmen Ugandan Ukrainian Uruguayan Uzbek Venezuelan Vietnamese
Welsh Yemeni Zambian Zimbabwean Soviet Prussian Ottoman Byzantine Roman Flemish Catalan Basque Bavarian
""".split())
"""Nationality adjectives the ``nationality`` rule recognises (a closed list: no guessing)."""

MONTHS = ("January February March April May June July August September October November December").split()
_MONTH = "(?:" + "|".join(MONTHS) + ")"
DATE = rf"(?:\d{{1,2}} {_MONTH} \d{{3,4}}|{_MONTH} \d{{1,2}},? \d{{3,4}}|{_MONTH} \d{{3,4}}|\d{{3,4}})"
"""A date as Wikipedia leads write it: ``13 April 1998``, ``April 13, 1998``, ``April 1998``, ``1998``."""

WORKS = {
    "film": "released", "movie": "released", "album": "released", "studio album": "released", "EP": "released",
    "single": "released", "song": "released", "video game": "released", "television series": "first aired",
    "TV series": "first aired", "sitcom": "first aired", "novel": "published", "book": "published",
    "short story": "published", "play": "first performed", "opera": "first performed", "musical": "first performed",
    "documentary": "released", "comic": "published", "manga": "published",
}
"""Kinds of creative work and the verb their year goes with."""

MAKERS = {"directed": "directed", "written": "wrote", "composed": "composed", "created": "created",
          "developed": "developed", "designed": "designed", "produced": "produced", "founded": "founded",
          "published": "published", "illustrated": "illustrated"}
"""``"<verb> by X"`` phrases and the question verb (``Who directed ...?``)."""

PLACES = ("city", "town", "village", "municipality", "commune", "suburb", "district", "county", "river", "lake",
          "mountain", "island", "region", "neighbourhood", "neighborhood", "hamlet", "parish", "settlement",
          "census-designated place", "unincorporated community", "township", "borough", "province", "state",
          "locality", "comune", "gmina", "capital", "port", "valley", "peninsula", "mountain range", "desert", "bay")
_PLACE = "(?:" + "|".join(sorted(map(re.escape, PLACES), key=len, reverse=True)) + ")"

PERSON_WORDS = frozenset("""actor actress singer songwriter player footballer politician writer author poet painter
composer musician rapper director producer journalist lawyer judge businessman businesswoman entrepreneur scientist
physicist chemist mathematician philosopher historian economist engineer architect athlete cyclist boxer wrestler
swimmer coach manager priest bishop king queen prince princess emperor empress general officer soldier diplomat
comedian dancer model photographer sculptor novelist playwright screenwriter broadcaster presenter cricketer
activist explorer inventor physician surgeon monarch pharaoh sultan nobleman noblewoman peer saint pope guitarist
drummer pianist violinist conductor bandleader designer illustrator cartoonist animator astronaut jurist""".split())
"""Words that make a definitional lead a person (``Who was ...?``)."""

MAX_ANSWER_WORDS = 10
MAX_QUESTION_WORDS = 32
_CUT = re.compile(r"\s*(?:[,;:()\[\]]|\s(?:and|who|which|that|where|when|with|from|since|until|while|as|after|"
                  r"before|for|to|on|at|by|in)\s).*$")
_SENT = re.compile(r"(?<=[a-z0-9\)\]\"'])\.\s+(?=[A-Z])")
_PAREN = re.compile(r"\s*\([^()]*\)")
_ARTICLE = re.compile(r"^(?:a|an|the)\s+", re.I)
_FIELD_PREFIX = re.compile(r"^In [a-z][a-z ]{2,30}, ")


@dataclass(frozen=True)
class Candidate:
    """One generated question, before verification.

    Attributes:
        question: the question text.
        answers: gold aliases, the first the canonical answer.
        doc_id: the evidence passage's document id.
        rule: the rule (or generator) that wrote it.
        answer_type: ``date``, ``year``, ``place``, ``person``, ``nationality``, ``entity``,
            ``organisation``, ``taxon``.
    """

    question: str
    answers: tuple[str, ...]
    doc_id: str
    rule: str
    answer_type: str
    metadata: dict = field(default_factory=dict, compare=False)


def lead_sentence(text: str) -> str:
    """The first sentence of ``text``, white space collapsed (``""`` for empty text).

    >>> lead_sentence("Berlin is the capital of Germany. It has 3.7 million people.")
    'Berlin is the capital of Germany.'
    """
    text = " ".join(str(text).split())
    text = _FIELD_PREFIX.sub("", text)
    m = _SENT.search(text)
    return text[: m.start() + 1] if m else text


def base_title(title: str) -> str:
    """The title without a trailing disambiguation: ``"Forbidden Ground (2013 film)"`` -> ``"Forbidden Ground"``."""
    return _PAREN.sub("", title).strip()


def cut_phrase(s: str) -> str:
    """``s`` up to its first comma, bracket, clause word or preposition, stripped of a final period."""
    s = _CUT.sub("", s.strip())
    return s.rstrip(" .").strip()


def _words(s: str) -> int:
    return len(s.split())


def _answer_ok(a: str) -> bool:
    """1-10 words, some letter or digit, and no word cut at an abbreviation (``"U"``, ``"Arthur V"``)."""
    if not a or not 1 <= _words(a) <= MAX_ANSWER_WORDS or not any(ch.isalnum() for ch in a):
        return False
    return not re.search(r"(?:^|\s)[A-Z]$", a)


def _date_aliases(d: str) -> tuple[str, ...]:
    year = re.search(r"\d{3,4}$", d)
    return (d, year.group(0)) if year and year.group(0) != d else (d,)


def _place_aliases(p: str) -> tuple[str, ...]:
    """The place and each of its comma parts, up to the first part that is not a name
    (``"Russia, after Moscow"`` -> ``("Russia",)``)."""
    parts = []
    for x in (x.strip() for x in p.split(",")):
        if not x or not x[0].isupper():
            break
        parts.append(x)
    if not parts:
        return ()
    whole = ", ".join(parts)
    return tuple(dict.fromkeys([whole, *parts]))


def _subject(lead: str, title: str) -> tuple[str, str] | None:
    """``(subject, rest)`` where the lead starts with the title (or its base), skipping a
    bracketed aside after it; None when the lead is about something else."""
    for t in (title, base_title(title)):
        if t and lead.startswith(t):
            rest = lead[len(t):]
            rest = re.sub(r"^\s*,?\s*(?:\([^()]*(?:\([^()]*\)[^()]*)*\))\s*,?", " ", rest)
            rest = re.sub(r"^,[^,]{0,80},", " ", rest)  # "X, also known as Y, is ..."
            return base_title(title), rest.strip()
    return None


def rule_questions(doc: Document) -> list[Candidate]:
    """Every question the rules write for one passage (possibly none).

    Args:
        doc: a passage with ``title`` and ``text``; ``metadata["description"]`` (a
            Wikidata-style short description, as the ovos summaries carry) is used when set.

    Returns:
        Candidates in rule order; duplicates and unanswerable ones are removed later.
    """
    title = str(doc.title or "").strip()
    lead = lead_sentence(doc.text)
    if not title or not lead:
        return []
    out: list[Candidate] = []

    def add(q: str, answers: tuple[str, ...], rule: str, atype: str) -> None:
        a = answers[0] if answers else ""
        if _answer_ok(a) and 3 <= _words(q) <= MAX_QUESTION_WORDS:
            out.append(Candidate(q, answers, doc.doc_id, rule, atype))

    name = base_title(title)
    # birth and death dates in the bracket after the name: "(born 13 April 1998)", "(24 May 1900 - 31 October 1984)"
    bracket = re.match(rf"^{re.escape(name)}[^()]{{0,60}}?\(([^()]*)\)", lead) or \
        re.match(rf"^{re.escape(title)}[^()]{{0,60}}?\(([^()]*)\)", lead)
    is_person = False
    if bracket:
        inside = bracket.group(1)
        m = re.search(rf"(?:^|;\s*|\s)born\s+(?:on\s+)?({DATE})", inside)
        if m:
            add(f"When was {name} born?", _date_aliases(m.group(1)), "born", "date")
            is_person = True
        m = re.search(rf"({DATE})\s*[\u2013\u2014-]+\s*({DATE})\s*$", inside)
        if m and not re.search(r"\bborn\b", inside):
            add(f"When was {name} born?", _date_aliases(m.group(1)), "born", "date")
            add(f"When did {name} die?", _date_aliases(m.group(2)), "died", "date")
            is_person = True
    m = re.search(rf"\bborn\s+(?:on\s+)?(?:{DATE}\s+)?in\s+([A-Z][^.;()]*)", lead)
    if m:
        place = m.group(1).split(" and ")[0].split(" to ")[0].strip(" ,.")
        place = re.sub(r",?\s+(?:is|was|who|where)\b.*$", "", place)
        add(f"Where was {name} born?", _place_aliases(place), "birthplace", "place")
        is_person = True

    m = re.search(rf"\b(?:founded|established|formed|incorporated|opened)\s+(?:in|on)\s+({DATE})\b", lead)
    if m:
        add(f"When was {name} founded?", _date_aliases(m.group(1)), "founded", "year")
    m = re.search(r"\bheadquartered in ([A-Z][^;.()]*)", lead)
    if m:
        place = re.sub(r"\s+(?:and|with|which|that|where)\b.*$", "", m.group(1)).strip(" ,")
        add(f"Where is {name} headquartered?", _place_aliases(place), "headquarters", "place")

    subj = _subject(lead, title)
    if subj is None:
        return out
    _, rest = subj
    verb_m = re.match(r"^(is|was|are|were)\s+(.*)$", rest)
    if not verb_m:
        return out
    verb, pred = verb_m.group(1), verb_m.group(2)
    pred_np = _ARTICLE.sub("", pred)
    first = pred_np.split()[0] if pred_np.split() else ""
    words = set(re.findall(r"[a-z]+", pred.lower()))
    if PERSON_WORDS & set(re.findall(r"[a-z]+", pred_np.split(",")[0].lower())):
        is_person = True

    # nationality: "is an American actor" / "was a Saudi Arabian football player"
    if first in DEMONYMS and is_person:
        nat = first
        second = pred_np.split()[1] if len(pred_np.split()) > 1 else ""
        if second in DEMONYMS or second == "Arabian":
            nat = f"{first} {second}"
        add(f"What nationality {verb} {name}?", (nat,), "nationality", "nationality")

    # creative works: "is a 2013 Australian action drama film"
    for kind in sorted(WORKS, key=len, reverse=True):
        m = re.match(rf"^(?:the\s+)?(?:[a-z]+\s+)?(\d{{4}})\s+(?:[A-Za-z-]+\s+){{0,5}}?{re.escape(kind)}\b", pred_np)
        if m:
            add(f"In what year was the {kind} {name} {WORKS[kind]}?", (m.group(1),), "work_year", "year")
            for made, qverb in MAKERS.items():
                mm = re.search(rf"\b{made} by ([A-Z][^,;.()]*)", lead)
                if mm and made in ("directed", "written", "composed", "created", "developed", "produced"):
                    who = cut_phrase(mm.group(1))
                    add(f"Who {qverb} the {m.group(1)} {kind} {name}?", (who,), "made_by", "person")
            mm = re.search(r"\bby (?:the )?(?:[A-Z][a-z]+ )?(?:[a-z-]+ ){0,3}(?:band|singer|rapper|group|duo|"
                           r"artist|musician|author|writer|novelist|songwriter) ([A-Z][^,;.()]*)", lead)
            if mm:
                who = cut_phrase(mm.group(1))
                add(f"Who released the {kind} {name}?" if WORKS[kind] == "released"
                    else f"Who wrote the {kind} {name}?", (who,), "made_by", "person")
            break
    else:
        for made, qverb in MAKERS.items():
            mm = re.search(rf"\b(?:was |is )?{made} by ([A-Z][^,;.()]*)", lead)
            if mm and made in ("founded", "designed", "developed", "created"):
                add(f"Who {qverb} {name}?", (cut_phrase(mm.group(1)),), "founder" if made == "founded" else "made_by",
                    "person")
                break

    # places: "is a small village in the East Lindsey district of Lincolnshire, England"
    m = re.match(rf"^(?:(?:a|an|the)\s+)?(?:[a-z-]+\s+){{0,3}}{_PLACE}\s+(?:located\s+|situated\s+)?"
                 rf"(?:in|on)\s+(?:the\s+)?([A-Z][^;.()]*)", pred)
    if m and not is_person:
        place = re.sub(r"\s+(?:and|with|which|that|where|near|about|approximately|located)\b.*$", "", m.group(1))
        place = place.strip(" ,")
        add(f"Where is {name} located?", _place_aliases(place), "location", "place")
    m = re.match(r"^(?:the\s+)?(?:[a-z]+\s+)?capital(?:\s+city)?\s+of\s+(?:the\s+)?([A-Z][^,;.()]*)", pred)
    if m:
        add(f"{name} is the capital of which country or region?", (cut_phrase(m.group(1)),), "capital_of", "place")
    m = re.search(r"\bplays? (?:as an? [a-z ]+ )?for ([A-Z][^,;.()]*)", lead)
    if m and is_person:
        add(f"Which team does {name} play for?", (cut_phrase(m.group(1)),), "team", "organisation")
    m = re.search(r"\bin the (?:[a-z]+ )?family ([A-Z][a-z]+)", lead)
    if m and re.match(r"^(?:a|an|the)?\s*(?:[a-z]+\s+){0,2}(?:species|genus)\b", pred):
        add(f"To which family does the {('genus' if 'genus' in words else 'species')} {name} belong?",
            (m.group(1),), "family", "taxon")

    # the title as the answer: the definitional predicate as the question
    definition = re.split(r";|\s\u2013\s|\s-\s", pred)[0].rstrip(" .")
    definition = _PAREN.sub("", definition)
    cut = definition.split()
    if len(cut) > 24:
        comma = definition.rfind(",", 0, len(" ".join(cut[:24])))
        definition = definition[:comma] if comma > 20 else " ".join(cut[:24])
    vague = re.match(r"^(?:the|a) (?:name|number|list|term|surname|given name|family name)\b|^one of|^any of",
                     definition)
    if re.match(r"^(?:a|an|the|one)\s", definition) and _words(definition) >= 6 and not vague:
        wh = "Who" if is_person else "What"
        add(f"{wh} {verb} {definition}?", (name,), "definition", "person" if is_person else "entity")
    desc = str((doc.metadata or {}).get("description") or "").strip()
    if desc and _words(desc) >= 5 and not re.search(r"\d{4}|disambiguation|Wikimedia", desc):
        d = desc[0].lower() + desc[1:]
        wh = "Who" if is_person else "What"
        q = f"{wh} is the {d}?" if is_person else f"What is the {d} called?"
        add(q, (name,), "description", "person" if is_person else "entity")
    return out
