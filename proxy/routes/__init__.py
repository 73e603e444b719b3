"""One module per wire API, plus health."""
