"""Questions made from a corpus and verified by retrieval (``drgym data synth``).

- :mod:`drgym.synth.rules`: the deterministic generator (rules over a passage's lead
  sentence, title and description; no model);
- :mod:`drgym.synth.teacher`: a teacher model as the generator (``openai:``/``hf:`` judges' backends);
- :mod:`drgym.synth.pipeline`: filter, verify in the env, cap, split by document, record.
"""
