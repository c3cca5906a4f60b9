"""Controllers: pure decision cores (samples in, decision + reason out) with an injected clock."""
