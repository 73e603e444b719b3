"""Pure decisions, no I/O: model limits, the token budget, token counting, compression.

Nothing here imports `proxy`, `middleware` or `adapters`.
"""
