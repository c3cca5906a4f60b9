"""The feature router: Envoy's external processor measuring request bodies for routes with
``match.features`` (measure.py is the pure part, server.py the gRPC shell)."""
