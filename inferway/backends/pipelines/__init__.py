"""Model pipelines: ``models/<name>/pipeline.yaml`` -- a DAG of calls to served models,
mixtures of experts, a step-result cache -- served like one model (docs/pipelines.md)."""
