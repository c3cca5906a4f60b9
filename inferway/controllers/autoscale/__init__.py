"""The autoscaler's pure core: metric samples and replica counts in, an explained Decision out.

Nothing here opens a socket, reads a file, sleeps or reads a clock: the caller passes the time
with every sample and every decision, so the same code runs live, in the unit tests and in
``bench/autoscale_sim.py``. Its config (``params.AutoscaleConfig``) is compiled from a
policy's ``autoscale:`` block by the gateway (gateway/autoscale_policy.py); drive an
``autoscaler.Autoscaler`` with it.
"""
