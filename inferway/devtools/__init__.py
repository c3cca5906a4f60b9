"""Development and demo tools: demo models and runner, OTLP receiver, trace tree, development CA.

Nothing in the product (gateway, xds, backends) imports from here; these exist to show and test it.
"""
