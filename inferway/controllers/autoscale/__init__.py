"""The autoscaler's pure core: metric samples and replica counts in, an explained Decision out.

Nothing here opens a socket, reads a file, sleeps or reads a clock: the caller passes the time
with every sample and every decision, so the same code runs live, in the unit tests and in
``bench/autoscale_sim.py``. Build a config with ``config.build_autoscale_config`` (or
``rule.build_from_scaling_policy`` for the issue's ``scaling_policy`` form) and drive an
``autoscaler.Autoscaler`` with it.
"""
