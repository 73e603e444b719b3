"""The configured upstreams, their adapters, and which one serves a model (`[routes]`)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

from brim.adapters.adapter import Adapter
from brim.adapters.cli import BRIM_SETTINGS_ONLY, ChildEnv, CliAdapter, cli_model
from brim.adapters.errors import NoRoute
from brim.adapters.raw import RawHttpAdapter
from brim.adapters.translated import LitellmAdapter
from brim.adapters.upstream_config import UpstreamConfig
from brim.policies.limits import CLI_MARKER
from brim.policies.remembered import Remembered
from brim.policies.wires import WIRES

# Which upstream `api` values can serve each endpoint, as each wire API declares it.
SERVES: dict[str, frozenset[str]] = {
    api: upstream_apis for wire in WIRES.values() for api, upstream_apis in wire.serving.items()
}


def build_adapter(
    name: str, config: UpstreamConfig, child_env: ChildEnv = BRIM_SETTINGS_ONLY
) -> Adapter:
    if config.api == "cli":
        return CliAdapter(name, config, child_env)
    if config.api == "litellm":
        return LitellmAdapter(name, config)
    return RawHttpAdapter(name, config)


def route_matches(model: str, pattern: str) -> bool:
    """Whether a `[routes]` glob matches a model id. A leading `[cli]` in a pattern is that
    marker itself (`[cli]gemini:*`), not a glob character class."""
    if pattern.startswith(CLI_MARKER):
        if not model.startswith(CLI_MARKER):
            return False
        model, pattern = model[len(CLI_MARKER) :], pattern[len(CLI_MARKER) :]
    return fnmatch.fnmatchcase(model, pattern)


ROUTES_REMEMBERED = 4_096  # (model, api) pairs whose upstream `Upstreams.route` keeps

API_NAMES = {
    "openai.chat": "Chat Completions",
    "openai.responses": "Responses",
    "anthropic.messages": "Messages",
    "anthropic.count_tokens": "Messages token-count",
    "gemini.generate": "Gemini generateContent",
}


class Upstreams:
    """Adapters by upstream name, plus routing. Routes are globs tried in order, each naming one
    upstream or a list of them; the first that matches the model and speaks the client's wire API
    wins. With no `[routes]` at all, each request goes to the first upstream that speaks its API.
    A CLI upstream's runs get `child_env`'s environment (brim's secrets left out).
    """

    def __init__(
        self,
        upstreams: Mapping[str, UpstreamConfig],
        routes: Mapping[str, str | Sequence[str]],
        child_env: ChildEnv = BRIM_SETTINGS_ONLY,
        *,
        adapters: Mapping[str, Adapter] | None = None,
    ) -> None:
        """`adapters`: some upstreams' adapters, already built (by `reconfigured`)."""
        self.configs = dict(upstreams)
        self.child_env = child_env
        self.routes = [
            (pattern, name)
            for pattern, names in routes.items()
            for name in ([names] if isinstance(names, str) else names)
        ]
        built = adapters or {}
        self.adapters: dict[str, Adapter] = {
            name: built.get(name) or build_adapter(name, config, child_env)
            for name, config in upstreams.items()
        }
        # The upstream chosen per (model, api): routes are fixed, models are client input.
        self._routed: Remembered[tuple[str, str], str] = Remembered(ROUTES_REMEMBERED)

    def reconfigured(
        self,
        upstreams: Mapping[str, UpstreamConfig],
        routes: Mapping[str, str | Sequence[str]],
        child_env: ChildEnv = BRIM_SETTINGS_ONLY,
    ) -> Upstreams:
        """The upstreams and routes of a changed configuration. An upstream whose settings did
        not change keeps its adapter, pooled connections and all (a CLI upstream's, if its
        children's environment did not change either); the others get new ones (the caller
        closes the adapters left behind once no request uses them)."""
        kept = {
            name: adapter
            for name, adapter in self.adapters.items()
            if upstreams.get(name) == (config := self.configs[name])
            and (config.api != "cli" or child_env == self.child_env)
        }
        return Upstreams(upstreams, routes, child_env, adapters=kept)

    def __getitem__(self, name: str) -> Adapter:
        return self.adapters[name]

    def route(self, model: str, api: str) -> str:
        """The upstream that serves `model` on `api` (remembered); `NoRoute` if none does."""
        key = (model, api)
        name = self._routed.get(key)
        if name is None:
            name = self._route(model, api)
            self._routed[key] = name
        return name

    def _route(self, model: str, api: str) -> str:
        name = self._pick(model, api)
        if self.configs[name].api == "cli":
            cli_model(model)  # a model name a CLI cannot be given is refused here, not run
        return name

    def _pick(self, model: str, api: str) -> str:
        serving = SERVES.get(api, frozenset())
        if not self.routes:
            for name, config in self.configs.items():
                if config.api in serving:
                    return name
            raise NoRoute(f"no upstream is configured for {api} requests", param="model")
        unable: list[str] = []
        for pattern, name in self.routes:
            if route_matches(model, pattern):
                if self.configs[name].api in serving:
                    return name
                unable.append(name)
        cli = [name for name in unable if self.configs[name].api == "cli"]
        if cli:
            raise NoRoute(
                f"The model {model!r} is served by upstream {cli[0]!r}, which runs a CLI "
                f"(api = cli) and answers Chat Completions requests only, not "
                f"{API_NAMES.get(api, api)} requests",
                param="model",
            )
        raise NoRoute(
            f"The model {model!r} does not exist or no route in brim's [routes] serves it",
            param="model",
        )

    def route_own_call(self, model: str, api: str) -> tuple[str, str]:
        """Where brim asks `model` itself for a client of wire API `api` (a summary), and in
        which API: the first `[routes]` pattern that matches the model decides the upstreams —
        the first of them that speaks `api`, else the first of them, in the first conversation
        API (Chat, Messages, Responses, Gemini) it speaks. With no `[routes]`: the first
        upstream that speaks `api`, else the first that speaks any. `NoRoute` if none can."""
        candidates = list(self.configs)
        if self.routes:
            first = next((p for p, _ in self.routes if route_matches(model, p)), None)
            if first is None:
                raise NoRoute(f"no route in brim's [routes] serves the model {model!r}")
            candidates = [name for pattern, name in self.routes if pattern == first]
        for name in candidates:
            if self.configs[name].api in SERVES.get(api, frozenset()):
                return name, api
        for name in candidates:
            for other in WIRES:
                if self.configs[name].api in SERVES[other]:
                    return name, other
        raise NoRoute(f"no upstream that serves the model {model!r} speaks a conversation API")

    def first_serving(self, api: str) -> str | None:
        """The upstream that answers model-independent requests (e.g. the model list)."""
        serving = SERVES.get(api, frozenset())
        candidates = [name for _, name in self.routes] or list(self.configs)
        return next((name for name in candidates if self.configs[name].api in serving), None)

    async def aclose(self) -> None:
        for adapter in self.adapters.values():
            await adapter.aclose()
