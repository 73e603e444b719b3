"""`[clients.NAME]` rules: recognise a client (a coding CLI, say) by User-Agent or a header, and
say how many tokens its provider spends before the user's input (CLI overhead), and whether
brim may offer its model `brim_restore`."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from brim.policies import model_table


class ClientRule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    user_agent: str | None = None  # glob over the User-Agent header, e.g. "claude-cli/*"
    header: str | None = None  # "Name: value-glob", e.g. "x-client: codex*"
    cli: str | None = None  # take the overhead of this CLI from the built-in table
    cli_overhead: int | None = Field(None, ge=0)  # or state it
    restore: bool = True  # offer brim_restore to this client's requests when brim cut them

    @model_validator(mode="after")
    def _complete(self) -> ClientRule:
        if self.user_agent is None and self.header is None:
            raise ValueError("a client rule needs user_agent or header to match on")
        if self.header is not None and ":" not in self.header:
            raise ValueError('header must look like "Name: value-glob"')
        if self.cli is None and self.cli_overhead is None and self.restore:
            raise ValueError("a client rule needs cli or cli_overhead (or restore = false)")
        return self

    @property
    def overhead(self) -> int:
        if self.cli_overhead is not None:
            return self.cli_overhead
        if self.cli is None:
            return 0
        return model_table.CLI_OVERHEAD.get(self.cli or "", model_table.DEFAULT_CLI_OVERHEAD)

    def matches(self, user_agent: str, headers: Mapping[str, str]) -> bool:
        if self.user_agent is not None and fnmatch.fnmatch(user_agent, self.user_agent):
            return True
        if self.header is not None:
            name, _, pattern = self.header.partition(":")
            value = headers.get(name.strip())
            return value is not None and fnmatch.fnmatch(value, pattern.strip())
        return False


def match_client(
    rules: Mapping[str, ClientRule], user_agent: str, headers: Mapping[str, str]
) -> tuple[str, ClientRule] | None:
    """The first rule (in file order) that matches, with its name."""
    for name, rule in rules.items():
        if rule.matches(user_agent, headers):
            return name, rule
    return None
