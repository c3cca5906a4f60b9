"""The endpoint picker for LLM backends (docs/picker.md): a pure scoring core (``core/``) and
the Envoy external processor that serves it, speaking the Gateway API Inference Extension's
Endpoint Picker protocol."""
