"""Certificates and keys: minting, PEM loading and key checks, shared by gateway, xds and backends."""
