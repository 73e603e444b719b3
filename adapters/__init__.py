"""Talking to providers: one interface (`Adapter.send`), one exception tree (`adapters.errors`)."""
