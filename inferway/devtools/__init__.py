"""Development and demo tools: the demo runner and its steps, the OTLP receiver, the trace tree.

Nothing in the product imports from here, except the gateway CLI's ``demo`` command, which
imports :mod:`inferway.devtools.demo` lazily (see docs/architecture.md); these exist to show
and test the product.
"""
