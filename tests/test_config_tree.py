"""The typed config tree (drgym.config): every shipped config parses, unknown keys and
wrong types are named, and every retrying component holds one RetryPolicy."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import httpx
import pytest
import yaml

from drgym.config import (
    RetryPolicy,
    RolloutRun,
    SearchSettings,
    TrainingConfig,
    parse_section,
    resolve_retry,
)
from drgym.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
BASE = {"name": "t"}


def _doc_yaml_blocks() -> list[tuple[str, str]]:
    """``(where, text)`` of every fenced YAML block in README.md and docs/."""
    out = []
    for md in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for i, m in enumerate(re.finditer(r"```ya?ml\n(.*?)```", md.read_text(encoding="utf-8"), flags=re.S)):
            out.append((f"{md.relative_to(REPO)}#{i}", m.group(1)))
    return out


# -- shipped configs --------------------------------------------------------------------------


def test_every_bundled_training_config_parses():
    from drgym.training.config import CONFIG_DIR, RunConfig, bundled_configs, load_config

    names = bundled_configs()
    assert len(names) >= 5
    for name in names:
        data = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
        parse_section(TrainingConfig, data)
        cfg = load_config(name)
        assert isinstance(cfg, RunConfig) and cfg.name == name
        cfg.rollout_settings()
        parse_section(SearchSettings, cfg.search)
    # RunConfig holds exactly the sections TrainingConfig knows (plus where it came from)
    assert {f.name for f in dataclasses.fields(RunConfig)} - {"source"} == set(TrainingConfig.model_fields)


def test_every_shipped_run_file_parses(tmp_path):
    """The run files shipped in the docs (``# run.yaml`` blocks) and any in the repository."""
    from drgym.evaluation.run_config import RolloutConfig, read_run_file

    runs = [(w, t) for w, t in _doc_yaml_blocks() if t.lstrip().startswith("# run.yaml")]
    for p in REPO.rglob("*.y*ml"):
        if ".venv" in p.parts or not p.is_file():
            continue
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and "policy" in data and "name" not in data:
            runs.append((str(p.relative_to(REPO)), p.read_text(encoding="utf-8")))
    assert runs, "no run file found"
    for i, (where, text) in enumerate(runs):
        f = tmp_path / f"run{i}.yaml"
        f.write_text(text, encoding="utf-8")
        given = read_run_file(f)
        assert given and set(given) <= set(RolloutRun.model_fields), where
        RolloutConfig(**given)


def test_the_search_sections_in_the_docs_parse():
    """Every ``search:`` block in the docs is a valid search section (one retry spelling)."""
    found = 0
    for where, text in _doc_yaml_blocks():
        data = yaml.safe_load(text)
        if isinstance(data, dict) and isinstance(data.get("search"), dict):
            parse_section(SearchSettings, data["search"])
            found += 1
    assert found >= 2


# -- unknown keys and wrong types ---------------------------------------------------------------


@pytest.mark.parametrize("patch, path, close", [
    ({"nmae": "x"}, "nmae", "name"),
    ({"env": {"kwarg": {}}}, "env.kwarg", "kwargs"),
    ({"search": {"corpuss": "hotpotqa"}}, "search.corpuss", "corpus"),
    ({"search": {"retry": {"atempts": 2}}}, "search.retry.atempts", "attempts"),
    ({"tasks": {"trian": "hotpotqa-dev"}}, "tasks.trian", "train"),
    ({"tasks": {"train": {"set": "hotpotqa-dev", "limt": 4}}}, "tasks.train.limt", "limit"),
    ({"rollout": {"max_turn": 2}}, "rollout.max_turn", "max_turns"),
    ({"rewards": [{"name": "f1", "wieght": 1.0}]}, "rewards[0].wieght", "weight"),
    ({"eval": {"every_step": 2}}, "eval.every_step", "every_steps"),
    ({"launch": {"accelerate_cfg": "x.yaml"}}, "launch.accelerate_cfg", "accelerate_config"),
    ({"zero_variance": {"filter_group": True}}, "zero_variance.filter_group", "filter_groups"),
    ({"entropy_brake": {"floor": 0.3, "windw": 5}}, "entropy_brake.windw", "window"),
])
def test_an_unknown_key_names_its_section_and_the_closest_key(patch, path, close):
    from drgym.training.config import parse_config

    with pytest.raises(ConfigError) as e:
        parse_config({**BASE, **patch}, source="run.yaml")
    msg = str(e.value)
    assert msg.startswith(f"run.yaml: {path}: unknown ") and f"Did you mean {close!r}?" in msg, msg


def test_an_unknown_key_of_a_run_file_or_a_retry_block_is_named(tmp_path):
    from drgym.evaluation.run_config import read_run_file

    f = tmp_path / "run.yaml"
    f.write_text("policy: scripted\nbatch_sise: 2\n")
    with pytest.raises(ConfigError, match=r"batch_sise: unknown top-level key\. Did you mean 'batch_size'\?"):
        read_run_file(f)
    with pytest.raises(ConfigError, match=r"^retry\.timeout: unknown retry key\. Did you mean 'timeout_s'\?"):
        RetryPolicy(timeout=3)
    # an old per-component spelling points at the retry block
    with pytest.raises(ConfigError, match=r"search\.attempts: unknown search key\. Retries and timeouts are set under 'retry:'"):
        parse_section(SearchSettings, {"attempts": 2})


@pytest.mark.parametrize("patch, match", [
    ({"rollout": {"max_turns": "two"}}, r"rollout\.max_turns must be an integer, got 'two'"),
    ({"enable_thinking": "yes"}, r"enable_thinking must be true, false or null, got 'yes'"),
    ({"eval": {"greedy": "maybe"}}, r"eval\.greedy must be true or false, got 'maybe'"),
    ({"search": {"retry": {"timeout_s": "soon"}}}, r"search\.retry\.timeout_s must be a number, got 'soon'"),
    ({"search": {"retry": {"attempts": 0}}}, r"search\.retry\.attempts must be >= 1, got 0"),
    ({"tasks": {"train": {"set": "hotpotqa-dev", "start": "x"}}}, r"tasks\.train\.start must be an integer, got 'x'"),
    ({"trainable_layers": "top"}, r"trainable_layers must be an integer or null, got 'top'"),
    ({"rollout": [2]}, r"rollout must be a mapping, got \[2\]"),
    ({"protocol": "xml"}, r"protocol: Unknown protocol 'xml'"),
])
def test_a_wrong_type_names_the_field_and_the_expected_type(patch, match):
    from drgym.training.config import parse_config

    with pytest.raises(ConfigError, match=match):
        parse_config({**BASE, **patch})


def test_a_wrong_type_in_a_run_file_names_the_field(tmp_path):
    from drgym.evaluation.run_config import read_run_file

    f = tmp_path / "run.json"
    f.write_text('{"policy": "scripted", "batch_size": "many"}')
    with pytest.raises(ConfigError, match=r"batch_size must be an integer, got 'many'"):
        read_run_file(f)


def test_models_built_in_code_raise_config_errors():
    from drgym.training.rollout import RolloutSettings

    with pytest.raises(ConfigError, match=r"rollout\.max_turns must be >= 1, got 0"):
        RolloutSettings(max_turns=0)
    with pytest.raises(ConfigError, match=r"retry\.timeout_s must be a positive number of seconds, got 0"):
        RetryPolicy(timeout_s=0)


# -- one RetryPolicy -----------------------------------------------------------------------------


def test_a_policy_keeps_the_component_default_for_the_fields_it_leaves_out():
    default = RetryPolicy(attempts=4, timeout_s=15.0, backoff_s=0.5, max_backoff_s=8.0)
    assert resolve_retry(None, default) is default
    assert resolve_retry({"attempts": 2}, default) == default.model_copy(update={"attempts": 2})
    assert resolve_retry(RetryPolicy(timeout_s=3.0), default).timeout_s == 3.0
    assert resolve_retry(RetryPolicy(timeout_s=3.0), default).attempts == 4
    with pytest.raises(ConfigError, match="retry must be a mapping"):
        resolve_retry(3, default)


def test_send_with_retries_takes_a_retry_policy():
    from drgym.search.retry import RetryableHTTPError, send_with_retries

    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"]["read"])
        return httpx.Response(503)

    with httpx.Client(transport=httpx.MockTransport(answer)) as client, pytest.raises(RetryableHTTPError,
                                                                                    match=r"after 3 attempt"):
        send_with_retries(client, "GET", "http://x/search", backend="t",
                          retry=RetryPolicy(attempts=3, timeout_s=1.5, backoff_s=0.0, max_backoff_s=0.0))
    assert seen == [1.5, 1.5, 1.5]


def test_the_http_search_client_stores_a_retry_policy():
    from drgym.search.client import HTTPSearchClient

    c = HTTPSearchClient("http://127.0.0.1:9", drgym=False, retry={"attempts": 2, "timeout_s": 3.0})
    try:
        assert c.retry == HTTPSearchClient.DEFAULT_RETRY.model_copy(
            update={"attempts": 2, "timeout_s": 3.0, "reconnect_s": c.retry.reconnect_s})
        assert c._client.timeout.read == 3.0
    finally:
        c.close()


def test_the_web_backends_store_a_retry_policy():
    from drgym.search.web import SerperSearch

    b = SerperSearch("key", base_url="http://127.0.0.1:9", retry=RetryPolicy(attempts=2))
    try:
        assert b.retry == SerperSearch.DEFAULT_RETRY.model_copy(update={"attempts": 2})
        assert b.page_fetcher.retry.timeout_s == 20.0  # at least 20 s per page
    finally:
        b.close()


def test_the_page_fetcher_stores_a_retry_policy():
    from drgym.search.pages import PageFetcher

    f = PageFetcher(retry={"timeout_s": 5.0})
    assert isinstance(f.retry, RetryPolicy) and (f.retry.attempts, f.retry.timeout_s) == (3, 5.0)


def test_the_mcp_backend_stores_a_retry_policy():
    from drgym.search.mcp import MCPSearchBackend

    b = MCPSearchBackend("http://127.0.0.1:9/mcp", retry={"attempts": 1, "reconnect_s": 0})
    try:
        assert b.retry == MCPSearchBackend.DEFAULT_RETRY.model_copy(update={"attempts": 1, "reconnect_s": 0.0})
    finally:
        b.close()


def test_the_openai_policy_stores_a_retry_policy():
    from drgym.policies.factory import make_policy

    pol = make_policy("openai:m@http://127.0.0.1:9/v1", retry={"attempts": 2, "timeout_s": 7.0, "reconnect_s": 5})
    try:
        assert pol.retry == RetryPolicy(attempts=2, timeout_s=7.0, backoff_s=0.5, max_backoff_s=8.0, reconnect_s=5.0)
        assert pol.describe()["retry"]["attempts"] == 2
    finally:
        pol.close()


def test_the_reachability_check_follows_its_retry_policy(monkeypatch):
    import time

    from drgym.errors import ServiceUnavailableError
    from drgym.policies import factory

    calls, waits = [], []

    def refuse(url, timeout):
        calls.append(timeout)
        raise httpx.ConnectError("refused")

    monkeypatch.setattr(httpx, "get", refuse)
    monkeypatch.setattr(time, "sleep", waits.append)
    assert isinstance(factory.REACHABLE_RETRY, RetryPolicy)
    with pytest.raises(ServiceUnavailableError, match=r"failed 3 attempt\(s\)"):
        factory.check_policy_reachable("openai:m@http://127.0.0.1:9/v1",
                                       retry={"attempts": 3, "timeout_s": 0.5, "backoff_s": 0.1, "max_backoff_s": 0.15})
    assert calls == [0.5, 0.5, 0.5] and waits == [0.1, 0.15]


def test_the_judges_store_a_retry_policy():
    from drgym.judges.local import HFJudge
    from drgym.judges.openai import OpenAIJudge

    j = OpenAIJudge("m", "http://127.0.0.1:9/v1", cache=False, retry={"attempts": 2, "timeout_s": 9.0})
    assert j.retry == OpenAIJudge.DEFAULT_RETRY.model_copy(
        update={"attempts": 2, "timeout_s": 9.0, "reconnect_s": j.retry.reconnect_s})
    assert j.client.timeout.read == 9.0
    assert HFJudge(cache=False).retry.backoff_s == 0.0 and HFJudge(cache=False).retry.attempts == 3


def test_the_retry_block_of_a_yaml_config_reaches_the_search_client(tmp_path):
    from drgym.search.client import HTTPSearchClient
    from drgym.search.registry import backend_from_settings, make_backend
    from drgym.training.config import load_config

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("name: retry-check\n"
                        "search:\n"
                        "  backend: http://127.0.0.1:9/retry-check\n"
                        "  drgym: false\n"
                        "  retry: {attempts: 2, timeout_s: 3.5, backoff_s: 0.25}\n")
    cfg = load_config(cfg_file)
    want = HTTPSearchClient.DEFAULT_RETRY.model_copy(update={"attempts": 2, "timeout_s": 3.5, "backoff_s": 0.25})
    b = backend_from_settings(cfg.search)
    assert isinstance(b, HTTPSearchClient)
    assert b.retry.model_copy(update={"reconnect_s": None}) == want and b._client.timeout.read == 3.5
    same = make_backend("http://127.0.0.1:9/other", retry=yaml.safe_load("{attempts: 2, timeout_s: 3.5, backoff_s: 0.25}"))
    try:
        assert same.retry == b.retry
    finally:
        same.close()


def test_search_settings_know_every_backend_option():
    """The search section's keys are the keyword arguments of the backends make_backend builds."""
    from drgym.search.client import HTTPSearchClient
    from drgym.search.local import LocalSearchEngine
    from drgym.search.mcp import MCPSearchBackend
    from drgym.search.web import WebSearchBackend

    not_yaml = {"self", "folder", "corpus", "target", "page_fetcher", "_shared",
                "name"}  # name: make_backend's recording key, never the backend's
    params = set()
    for fn in (LocalSearchEngine.__init__, LocalSearchEngine.from_corpus, WebSearchBackend.__init__,
               HTTPSearchClient.__init__, HTTPSearchClient.deepresearchgym, MCPSearchBackend.__init__):
        params |= {p for p, v in inspect.signature(fn).parameters.items()
                   if v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)}
    assert params - not_yaml <= set(SearchSettings.model_fields), params - not_yaml - set(SearchSettings.model_fields)
