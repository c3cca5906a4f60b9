"""Controllers: pure decision cores (samples in, decision and reason out, clock injected).

They never touch the user's files or the network; the gateway wires them to metric sources and
writes their decisions into State as overrides.
"""
