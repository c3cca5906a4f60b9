"""Progressive delivery: a pure canary-rollout controller and its statistical analysis.

``config`` holds the rollout's own settings, ``stats`` the tests (SPRT, Mann-Whitney U),
``analysis`` turns accumulated evidence into verdicts, ``state`` is the JSON-serialisable
record, and ``controller`` moves the weight on verdicts and commands.
"""
