"""steward: a local OpenAI-compatible MLX model server that never lies about its backend."""

__version__ = "0.1.0"
