"""Typed settings of one upstream, checked at construction (the `[upstreams.NAME]` table)."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

WireApi = Literal["openai", "anthropic", "litellm"]


class FrozenModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class UpstreamConfig(FrozenModel):
    api: WireApi
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = Field(600, gt=0)
    connect_timeout_s: float = Field(10, gt=0)
    model_prefix: str = ""
    api_key: SecretStr | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _read_api_key(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if k != "api_key"}  # only ever from the env
        if data.get("api_key_env"):
            name = data["api_key_env"]
            value = os.environ.get(name)
            if not value:
                raise ValueError(f"api_key_env names {name!r}, which is not set")
            data = {**data, "api_key": SecretStr(value)}
        return data

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https:// (got {value!r})")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _base_url_required(self) -> UpstreamConfig:
        if self.api != "litellm" and self.base_url is None:
            raise ValueError(f"base_url is required for api = {self.api!r}")
        return self
