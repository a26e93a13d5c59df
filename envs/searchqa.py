"""``drgym/SearchQA-v0``: answer a short question by searching and fetching."""

from __future__ import annotations

from drgym.envs.core import SearchAgentEnv


class SearchQAEnv(SearchAgentEnv):
    """Short-answer QA with a search engine: the Search-R1 setting (Jin et al. 2025, §3).

    **Description.** Each episode poses one question (a :class:`~drgym.records.Task`,
    by default from ``hotpotqa-dev``: HippoRAG's 79 HotpotQA questions, whose supporting
    paragraphs are in the default corpus ``wiki-default``). The agent may search and fetch
    for several turns and ends by answering.

    **Action Space.** :class:`~drgym.envs.text.UnicodeText` of up to ``max_action_chars``
    characters: the model's text for one turn, parsed by
    :func:`drgym.envs.parsing.parse_action` (Search-R1 tags, ``<tool_call>`` JSON, or an
    OpenAI-style assistant message with ``tool_calls``, as a dict or JSON text).

    **Observation Space.** :class:`~drgym.envs.text.UnicodeText` (any Unicode, up to
    1,000,000 characters): the text to append to the conversation. At reset, the system
    and user prompts joined by a blank line; after a tags-protocol turn,
    ``\\n\\n<information>Doc 1 (Title: T, URL: u) text\\nDoc 2 ...</information>\\n\\n``;
    after a JSON/OpenAI turn, the tool message contents; after an invalid turn, a
    corrective message. Each tool result is cut to ``max_obs_tokens`` drgym tokens.

    **Starting State.** The task is drawn with ``self.np_random`` (seeded by
    ``reset(seed=...)``), or chosen by ``options={"task_id": ...}``,
    ``{"task_index": i}`` or ``{"task": Task(...)}``.

    **Rewards.** 0.0 on every step but the last. At the end (answer or truncation) the
    configured reward scores an :class:`~drgym.records.Episode` (answer ``""`` if
    none was given); default ``"f1"`` (HotpotQA token F1 over the gold aliases, via
    :func:`drgym.rewards.get_reward`). Minus ``format_penalty`` per invalid action.

    **Episode End.** Terminated when the agent answers. Truncated after ``max_turns``
    turns without an answer, or when the observations of the episode exceed
    ``max_total_obs_tokens``. Searches/fetches beyond their budgets are refused with a
    message (not truncation); on the last turn they are not run.

    **Information.** ``episode_id``, ``task_id``, ``question``, ``kind``, ``messages``
    (chat history incl. this turn), ``tool_calls`` (parsed, as dicts), ``results``
    (retrieved passages / fetched document dicts of this turn), ``error`` (backend
    failure text or None), ``turn``, ``turns_left``, ``searches_left``,
    ``fetches_left``, ``obs_tokens``, ``invalid_actions``; at the end also
    ``final_answer``, ``reward_components`` and ``trajectory``
    (:class:`~drgym.records.Trajectory`).

    **Arguments.** See :class:`~drgym.envs.core.SearchAgentEnv`. Defaults here:
    ``max_turns=4``, ``max_searches=3``, ``max_fetches=2``, ``max_obs_tokens=500``,
    ``top_k=3``.

    **Version History.** v0: first version.
    """

    kind = "qa"
    default_tasks = "hotpotqa-dev"
    default_reward = "f1"
    env_id = "drgym/SearchQA-v0"
