"""The pipeline: small stages, each `__call__(exchange, call_next)`, in one visible order."""
