"""The tools declare their own syntax: stop strings and call text come from the ``Tool`` objects.

A GRPO config that allows fetch gets a system prompt describing ``<fetch>``; its generator
must stop at ``</fetch>`` as at ``</search>`` (the vLLM path through TRL's real code with
a recording engine, and the HF path), and every hand-written call (scripted and RAG
policies) is the tools' own rendering, parsed back by the env's parser.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from _fake_vllm import FakeLLM, FakeSamplingParams, FakeTrainer, ScriptedSearcher, fake_accelerator, vllm_generation  # noqa: E402

from drgym.envs.tools import DEFAULT_TOOLS, FetchTool, FindInPageTool, SearchTool, stop_strings  # noqa: E402


def test_stop_strings_are_what_the_tools_declare():
    assert stop_strings(DEFAULT_TOOLS, "tags") == ("</search>", "</fetch>", "</answer>")
    assert stop_strings(DEFAULT_TOOLS, "tags") == tuple(f"</{t.name}>" for t in DEFAULT_TOOLS)
    assert stop_strings(DEFAULT_TOOLS, "json") == ("</tool_call>",)
    tools = (*DEFAULT_TOOLS, FindInPageTool())
    assert stop_strings(tools, "tags") == ("</search>", "</fetch>", "</answer>", "</find_in_page>")
    with pytest.raises(ValueError, match="protocol must be"):
        stop_strings(DEFAULT_TOOLS, "xml")
    with pytest.raises(ValueError, match="at least one tool"):
        stop_strings((), "tags")


def test_every_stop_list_is_the_tools_one():
    """Training's, the policies' and the rollout settings' stop strings are all made by one function."""
    from drgym.policies.generation import DEFAULT_STOPS, close_open_tag
    from drgym.training.rollout import JSON_STOP_STRINGS, STOP_STRINGS, RolloutSettings

    assert STOP_STRINGS == ("</search>", "</fetch>", "</answer>")  # </fetch> was missing
    assert JSON_STOP_STRINGS == ("</tool_call>",)
    assert DEFAULT_STOPS == ("</search>", "</fetch>", "</answer>", "</tool_call>")
    assert RolloutSettings(protocol="tags").stops == STOP_STRINGS
    assert RolloutSettings(protocol="json").stops == JSON_STOP_STRINGS
    # an API that strips the stop string: the closing tag of any tool comes back
    assert close_open_tag("<fetch> https://en.wikipedia.org/wiki/Lyon ") == "<fetch> https://en.wikipedia.org/wiki/Lyon </fetch>"
    find_stops = stop_strings((*DEFAULT_TOOLS, FindInPageTool()), "tags")
    assert close_open_tag("<find_in_page>u x", find_stops) == "<find_in_page>u x</find_in_page>"


@pytest.mark.parametrize("protocol", ["tags", "json", "openai"])
def test_rendered_calls_parse_back(protocol):
    from drgym.envs.parsing import Parser

    tools = (*DEFAULT_TOOLS, FindInPageTool())
    parser = Parser(tools, ("tags", "json", "openai"), 32_000)
    cases = [(SearchTool(), {"query": 'capital of "France"'}),
             (FetchTool(), {"url": "https://en.wikipedia.org/wiki/Lyon"}),
             (FindInPageTool(), {"url": "https://en.wikipedia.org/wiki/Lyon", "text": "population of Lyon"})]
    for tool, args in cases:
        parsed = parser.parse(tool.render(args, protocol, call_id="call_7"))
        assert [(c.name, c.arguments) for c in parsed.calls] == [(tool.name, args)]
    with pytest.raises(ValueError, match="missing or not a string: \\['text'\\]"):
        FindInPageTool().render({"url": "u"})
    with pytest.raises(ValueError, match="protocol must be"):
        SearchTool().render("q", "xml")


def test_scripted_and_rag_calls_are_the_tools_rendering():
    from drgym.policies.rag import RagPolicy
    from drgym.policies.scripted import ScriptedPolicy

    info = {"turn": 0, "question": "Who directed Sinister?", "episode_id": "e"}
    assert ScriptedPolicy("tags").act([[]], [info]) == ["<search> Who directed Sinister? </search>"]
    assert ScriptedPolicy("json").act([[]], [info]) == [
        '<tool_call>\n{"name": "search", "arguments": {"query": "Who directed Sinister?"}}\n</tool_call>']
    fetch = ScriptedPolicy("tags").act([[]], [{"turn": 1, "question": "q", "episode_id": "e",
                                               "results": [{"url": "https://x.org/a", "text": "A b", "title": "A"}]}])
    assert fetch == [FetchTool().render("https://x.org/a")] == ["<fetch> https://x.org/a </fetch>"]
    with pytest.raises(ValueError, match=re.escape("needs the tools ['fetch']")):
        ScriptedPolicy(tools=(SearchTool(), DEFAULT_TOOLS[2]))

    class Reader:
        name = "reader"

        def act(self, conversations, infos=None):
            return ["The answer is: Scott Derrickson."] * len(conversations)

    rag = RagPolicy(Reader())
    conv = [{"role": "user", "content": "Question: Who directed Sinister?"}]
    assert rag.act([conv], [{"question": "Who directed Sinister?"}]) == ["<search> Who directed Sinister? </search>"]


# -- a fetch-enabled GRPO config -----------------------------------------------------------------
class FetchingSearcher(ScriptedSearcher):
    """Searches the question, fetches the top result's URL, then answers; rambles after each call."""

    def text(self, prompt_ids):
        ctx = self.tok.decode(prompt_ids, skip_special_tokens=False)
        q = next((q for q in self.plan if q in ctx), None)
        if q is None:
            return "<answer> PADDING ROW </answer>"
        urls = re.findall(r"URL: (\S+?)\)", ctx)
        if "<information>" not in ctx.split("<|im_start|>assistant", 1)[-1]:
            act = f"<search> {q} </search>"
        elif "<fetch>" not in ctx.split("<|im_start|>assistant", 1)[-1]:
            act = f"<fetch> {urls[0]} </fetch>"
        else:
            act = f"<answer> {self.plan[q][1]} </answer>"
        return act + self.ramble


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from drgym.models import load_pretrained, resolve_lm

    return load_pretrained(AutoTokenizer, resolve_lm("smollm2"))


def _fetch_config_rollout(tokenizer, backend, tasks):
    """The bundled CPU config with fetch allowed (``max_fetches: 1``), its env factory and rollout function."""
    from drgym.training.config import load_config
    from drgym.training.data import build_dataset, make_env_factory
    from drgym.training.rollout import SearchRolloutFunc

    cfg = load_config("searchqa_smollm2_cpu", {"env": {"id": "drgym/SearchQA-v0", "kwargs": {
        "top_k": 1, "max_obs_tokens": 60, "max_searches": 1, "max_fetches": 1}},
        "rollout": {"max_turns": 3, "max_new_tokens": 64, "max_completion_tokens": 1024, "gen_batch_size": 8}})
    factory = make_env_factory(cfg, tasks, backend=backend)
    _, table = build_dataset(tasks, factory, tokenizer)
    assert "<fetch>" in next(iter(table))  # the prompt describes fetch
    return cfg, SearchRolloutFunc(factory, table, cfg.rollout_settings()), list(table)


def test_fetch_enabled_config_stops_at_fetch_on_vllm(monkeypatch, tokenizer, bm25_backend):
    import trl.generation.vllm_generation as vg

    from drgym.envs.task_loaders import load_tasks

    tasks = load_tasks("hotpotqa-dev")[:2]
    _, rf, prompts = _fetch_config_rollout(tokenizer, bm25_backend, tasks)
    model = FetchingSearcher(tokenizer, {t.question.strip(): (1, t.answers[0]) for t in tasks})
    monkeypatch.setattr(vg, "SamplingParams", FakeSamplingParams, raising=False)
    acc = fake_accelerator(0, 1)
    llm = FakeLLM(model)
    out = rf(prompts, FakeTrainer(acc, vllm_generation(acc, mode="colocate", llm=llm), tokenizer))

    assert llm.calls and all(c["stop"] == ["</search>", "</fetch>", "</answer>"] for c in llm.calls)
    for traj, t in zip(out["trajectory"], tasks):
        actions = [s["action"] for s in traj["steps"]]
        assert len(actions) == 3, actions
        # the fetch turn ends at </fetch>: the ramble after it was never generated
        assert actions[1].startswith("<fetch> ") and actions[1].endswith("</fetch>"), actions[1]
        assert [c["name"] for s in traj["steps"] for c in s["tool_calls"]] == ["search", "fetch", "answer"]
        assert traj["final_answer"] == t.answers[0]
    assert out["invalid_actions"] == [0, 0]


def test_fetch_enabled_config_stops_at_fetch_on_hf(monkeypatch, tokenizer, bm25_backend):
    """The HF turn step gets the env's stop strings, </fetch> included."""
    import drgym.training.rollout as ro
    from drgym.envs.task_loaders import load_tasks

    tasks = load_tasks("hotpotqa-dev")[:1]
    _, rf, prompts = _fetch_config_rollout(tokenizer, bm25_backend, tasks)
    model = FetchingSearcher(tokenizer, {t.question.strip(): (1, t.answers[0]) for t in tasks})
    seen = []

    def fake_turn(_model, tok, contexts, *, stops, **kw):
        seen.append(stops)
        return [model.complete(c, max_tokens=kw["max_new_tokens"], stop=list(stops), include_stop=True)[0]
                for c in contexts], None

    monkeypatch.setattr(ro, "hf_generate_turn", fake_turn)
    out = rf.run(prompts, model=None, tokenizer=tokenizer)
    assert seen and all(s == ("</search>", "</fetch>", "</answer>") for s in seen)
    actions = [s["action"] for s in out["trajectory"][0]["steps"]]
    assert actions[1].startswith("<fetch> ") and actions[1].endswith("</fetch>"), actions
    assert out["final_answer"] == [tasks[0].answers[0]]
