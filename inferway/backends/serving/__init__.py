"""The serving core: one transport-neutral inference path (readiness, limits, deadline, span,
metrics, batching, failure mapping) that the HTTP and gRPC front ends in ``protocol/`` adapt."""
