"""Progressive delivery: a pure canary-rollout controller and its statistical analysis.

``config`` holds the rollout's own settings, ``evidence`` the counts a metric source reports,
``stats`` the tests (SPRT, Mann-Whitney U), ``analysis`` turns evidence into verdicts,
``state`` is the JSON-serialisable record, and ``controller`` moves the weight on verdicts
and commands.
"""
