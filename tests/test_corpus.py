"""Corpus readers on small real samples (tests/data/corpus), round-tripped through the
drgym JSONL format, plus the shipped named corpora."""

from __future__ import annotations

import json

import pytest

from drgym.corpus import load_named_corpus, read_corpus, write_documents
from drgym.corpus.named import corpus_fingerprint, unique_urls
from drgym.corpus.readers import sniff_format
from drgym.corpus.urls import normalize_url, wikipedia_url
from drgym.errors import ConfigError, CorpusError

from conftest import DATA

CORPUS = DATA / "corpus"


def roundtrip(docs, tmp_path):
    path = tmp_path / "docs.jsonl"
    assert write_documents(docs, path) == len(docs)
    back = list(read_corpus(path))  # sniffed as the drgym format
    assert sniff_format(path) == "drgym"
    assert back == docs
    assert [d.metadata for d in back] == [d.metadata for d in docs]
    return back


def test_wiki18_flashrag_sample(tmp_path):
    own = list(read_corpus(CORPUS / "wiki18_sample.jsonl"))  # a corpus file: its ids, no URL made up
    assert [(d.doc_id, d.url) for d in own[:2]] == [("0", ""), ("1", "")]
    docs = list(read_corpus(CORPUS / "wiki18_sample.jsonl", wikipedia_urls=True))  # wiki-18 is Wikipedia
    assert sniff_format(CORPUS / "wiki18_sample.jsonl") == "wiki18"
    assert len(docs) == 5
    d = docs[0]
    assert d.doc_id == "0"
    assert d.title == "Evan Morris"  # the quotes around the title are removed
    assert d.text.startswith("Evan Morris Evan L. Morris (January 26, 1977")
    assert d.url == "https://en.wikipedia.org/wiki/Evan_Morris"
    assert docs[3].url == "https://en.wikipedia.org/wiki/Ao_Oni_(film)"
    assert d.contents.startswith('"Evan Morris"\nEvan Morris')
    roundtrip(docs, tmp_path)


@pytest.mark.parametrize("fname", ["web_rows.jsonl", "web_rows.parquet"])
def test_web_rows_jsonl_and_parquet(fname, tmp_path):
    docs = list(read_corpus(CORPUS / fname))
    assert sniff_format(CORPUS / fname) == "web"
    assert [d.title for d in docs] == ["", "", "", ""]
    assert docs[0].doc_id == "<urn:uuid:fw-0000>"  # the row's own id
    assert docs[0].url == "https://en.wikipedia.org/wiki/Teutberga"
    assert docs[0].text.startswith("Teutberga( died 11 November 875) was a queen of Lotharingia")  # 2Wiki text as stored
    assert docs[0].metadata["dump"] == "CC-MAIN-2024-10"
    assert docs[0].metadata["language_score"] == pytest.approx(0.97)
    roundtrip(docs, tmp_path)


def test_web_jsonl_and_parquet_agree_and_datasets_folder(tmp_path):
    import datasets

    a = list(read_corpus(CORPUS / "web_rows.jsonl"))
    b = list(read_corpus(CORPUS / "web_rows.parquet"))
    assert a == b
    folder = tmp_path / "ds"
    datasets.Dataset.from_parquet(str(CORPUS / "web_rows.parquet")).save_to_disk(str(folder))
    assert list(read_corpus(folder)) == a


def test_clueweb22_records(tmp_path):
    docs = list(read_corpus(CORPUS / "clueweb22_records.jsonl"))
    assert sniff_format(CORPUS / "clueweb22_records.jsonl") == "clueweb22"
    assert [d.doc_id for d in docs] == [f"clueweb22-en0000-00-{i:05d}" for i in range(3)]
    assert docs[0].title == "Riemann integral"  # first line of Clean-Text
    assert docs[0].url == "https://en.wikipedia.org/wiki/Riemann_integral"  # trailing newline stripped
    assert docs[0].text.startswith("In the branch of mathematics known as real analysis, the Riemann integral")
    roundtrip(docs, tmp_path)


def test_hipporag_list_and_dict(tmp_path):
    lst = list(read_corpus(CORPUS / "hipporag_list.json"))
    assert [d.title for d in lst] == ["Journal of Mathematical Physics", "Person-centered therapy",
                                     "Journal of Small Business Management", "Film Journal International"]
    assert lst[0].doc_id == "hipporag-00000"
    dct = list(read_corpus(CORPUS / "hipporag_dict.json"))
    assert [d.title for d in dct] == ["Demon Dice", "Demon algorithm", "Maha Sona", "Wangliang"]
    # sentences are joined as stored (each after the first starts with a space)
    assert dct[0].text.startswith("Demon Dice, originally published as Chaos Progenitus, is a collectible dice game")
    assert " In it, each player controls a demon made of 13 dice" in dct[0].text
    roundtrip(lst + dct, tmp_path)


def test_ovos_reader_on_installed_package():
    from drgym.corpus.named import ovos_summaries_path

    docs = list(read_corpus(ovos_summaries_path(), "ovos"))
    assert len(docs) == 10_033
    assert all(d.text for d in docs[:100])
    assert docs[0].doc_id == "ovos-00000" and docs[0].url.startswith("https://en.wikipedia.org/wiki/")


def test_bad_files_raise_corpus_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "contents": "x"}\nnot json\n')
    with pytest.raises(CorpusError, match="bad.jsonl:2"):
        list(read_corpus(bad))
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"foo": 1}) + "\n")
    with pytest.raises(CorpusError, match="cannot tell the format"):
        list(read_corpus(odd))
    with pytest.raises(CorpusError, match="not found"):
        list(read_corpus(tmp_path / "missing.jsonl"))


def test_named_corpora_sizes_and_unique_urls():
    hot = load_named_corpus("hotpotqa")
    assert len(hot) == 994
    wiki = load_named_corpus("wiki-default")
    assert len(wiki) == 10_033 + 994 + 1_890 + 6_119 + 1_000
    assert len({d.url for d in wiki}) == len(wiki)
    assert len({d.doc_id for d in wiki}) == len(wiki)
    # a title repeated across parts keeps distinct documents with distinct URLs
    assert corpus_fingerprint(hot) == corpus_fingerprint(load_named_corpus("hotpotqa"))
    with pytest.raises(ConfigError, match="Did you mean 'hotpotqa'"):
        load_named_corpus("hotpotqa2")


def test_unique_urls_appends_doc_id_fragment():
    docs = list(read_corpus(CORPUS / "hipporag_dict.json", wikipedia_urls=True))
    dup = [docs[0], docs[0].__class__("x-1", docs[0].url, "Demon Dice", "other text")]
    out = unique_urls(dup)
    assert out[0].url == "https://en.wikipedia.org/wiki/Demon_Dice"
    assert out[1].url == "https://en.wikipedia.org/wiki/Demon_Dice#x-1"


def test_urls():
    assert wikipedia_url("Lilu (mythology)") == "https://en.wikipedia.org/wiki/Lilu_(mythology)"
    assert normalize_url("http://en.m.wikipedia.org/wiki/Lilu%20(mythology)/") == "https://en.wikipedia.org/wiki/Lilu_(mythology)"
    assert normalize_url(wikipedia_url("Alû")) == "https://en.wikipedia.org/wiki/Alû"
