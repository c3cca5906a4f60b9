"""Certificates and keys: minting, PEM loading and key checks.

Shared by gateway, xds and backends, so it sits below all of them.
"""
