"""Policies: a batch of conversations in, one assistant turn each out.

:class:`~drgym.policies.base.Policy` is the interface; :func:`~drgym.policies.factory.make_policy`
builds one from a spec: ``hf:MODEL`` (:mod:`~drgym.policies.hf`), ``openai:MODEL@URL``
(:mod:`~drgym.policies.openai`), ``vllm:MODEL`` (:mod:`~drgym.policies.vllm`), ``rag:LLM``
(:mod:`~drgym.policies.rag`) and ``scripted`` (:mod:`~drgym.policies.scripted`);
:mod:`~drgym.policies.generation` holds the shared generation utilities (stop strings,
token usage).
"""
