"""The LLM gateway: Envoy's external processor for OpenAI-compatible routes (docs/llm.md)."""
