"""Certificates and keys: minting, bundle files and key checks.

Shared by gateway, xds and backends, so it imports none of them (the lowest layer).
"""
