"""The rollout controller at the edge: policy -> controller config, Envoy's stats -> window
samples, an async driver that ticks the controllers and writes weights into State, the
persisted state, and the admin API, metrics and CLI that show and command it."""
