"""Evaluation: run a policy over a task set and record, score and compare the runs.

:mod:`~drgym.evaluation.runner` (``drgym rollout``; its parts :mod:`~drgym.evaluation.run_config`,
:mod:`~drgym.evaluation.run_directory` and :mod:`~drgym.evaluation.rollout_loop`),
:mod:`~drgym.evaluation.metrics` (metrics over trajectories), :mod:`~drgym.evaluation.plots`,
:mod:`~drgym.evaluation.report` (``drgym report``), :mod:`~drgym.evaluation.compare`
(``drgym compare``: ranking agreement of search backends) and
:mod:`~drgym.evaluation.judged` (``drgym evaluate``: judged metrics over report files).
"""
