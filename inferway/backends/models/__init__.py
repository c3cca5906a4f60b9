"""The model repository: per-model config, scanning the directory, loading runners and the
served model versions the front ends look up."""
