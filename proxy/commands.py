"""The `brim` command: `brim serve`, `brim check-config`, `brim inspect`, `brim models`,
`brim archive get`, `brim init`, `brim --version`, `brim run` (proxy/launcher.py),
`brim status`, `brim limits`, `brim reload`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brim.policies.wires import WIRES
from brim.proxy.config import (
    BrimConfig,
    ConfigError,
    describe_config,
    load_config,
    parse_workers,
    refuse_open_without_keys,
)
from brim.proxy.inspect import (
    InspectError,
    inspect_request,
    model_rows,
    read_request,
    render_inspection,
    render_models,
    wire_named,
)
from brim.proxy.launcher import add_command as add_run_command
from brim.proxy.listen import CannotListen, listen_error
from brim.proxy.logs import FORMAT_ENV, FORMATS, LEVEL_ENV, LEVELS, chosen, configure_logging
from brim.proxy.reload import ConfigSource

if TYPE_CHECKING:
    from brim.policies.ratios import TokenRatios

DEFAULT_CONFIG = "proxy.toml"


def _load(path: str | None) -> BrimConfig:
    config, warnings = load_config(path)
    _warn(warnings)
    return config


def _warn(warnings: list[str]) -> None:
    for warning in warnings:
        print(f"brim: warning: {warning}", file=sys.stderr)


async def _serve(config: BrimConfig, source: ConfigSource) -> None:
    """One process serving the port (`workers = 1`)."""
    from brim.proxy.app import bound_port, run_until_stopped, start

    host, port = config.server.host, config.server.port
    try:
        runner = await start(config, host, port, source=source)
    except OSError as exc:
        error = listen_error(exc, host, port)
        if error is None:
            raise
        raise error from None
    print(f"brim listening on http://{host}:{bound_port(runner)}", flush=True)
    await run_until_stopped(runner)


def serve(args: argparse.Namespace) -> int:
    overrides = {
        key: value
        for key, value in (("host", args.host), ("port", args.port), ("workers", args.workers))
        if value is not None
    }
    source = ConfigSource(args.config, overrides)  # read again, the same way, on a reload
    config, warnings = source.load()
    _warn(warnings)
    workers = config.server.worker_count
    configure_logging(
        chosen(args.log_level, LEVEL_ENV, LEVELS, "info"),
        chosen(args.log_format, FORMAT_ENV, FORMATS, "text"),
        process_ids=workers > 1,  # with several workers, each line says which process wrote it
    )
    if workers > 1:
        from brim.proxy.workers import serve_workers

        return serve_workers(config, workers, source)
    from brim.proxy.app import loop_factory

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(_serve(config, source))
    return 0


def check_config(args: argparse.Namespace) -> int:
    """The checks `serve` makes before it listens, on the config `serve` would find."""
    config = _load(args.config)
    refuse_open_without_keys(config)
    print(f"{args.config or 'built-in defaults'}: OK", file=sys.stderr)
    print(json.dumps(describe_config(config), indent=2, ensure_ascii=False))
    return 0


def find_config(explicit: str | None) -> str | None:
    """--config, else $BRIM_CONFIG, else ./proxy.toml if there is one, else none (defaults)."""
    if explicit:
        return explicit
    if from_env := os.environ.get("BRIM_CONFIG"):
        return from_env
    return DEFAULT_CONFIG if Path(DEFAULT_CONFIG).is_file() else None


def shared_ratios(config: BrimConfig) -> TokenRatios:
    """The token ratios the brims on `[cache] url` learned (checked as a running brim checks
    them); none without a url, or when Redis does not answer (said on stderr)."""
    from brim.middleware.services.shared import RedisLink, SharedRatios, Unavailable
    from brim.policies.ratios import TokenRatios

    ratios = TokenRatios()
    cache = config.cache
    if not cache.url:
        return ratios

    async def read() -> None:
        link = RedisLink(cache.url or "", timeout_s=cache.timeout_s, retry_s=cache.retry_s)
        try:
            await SharedRatios(link, ratios, config.upstreams).pull()
        except Unavailable:
            print("brim: Redis did not answer: no learned token ratios shown", file=sys.stderr)
        finally:
            await link.aclose()

    asyncio.run(read())
    return ratios


def inspect(args: argparse.Namespace) -> int:
    from brim.adapters.errors import NoRoute
    from brim.proxy.app import build_services

    config = _load(args.config)
    services = build_services(config)
    body = read_request(args.request)
    wire = wire_named(args.api, body)
    model = args.model or body.get("model")
    try:
        upstream = services.upstreams.route(str(model or ""), wire.name)
    except NoRoute:
        upstream = None
    report = inspect_request(
        config,
        services.limits,
        services.counter,
        body,
        model=args.model,
        user_agent=args.user_agent or "",
        api=args.api,
        ratios=shared_ratios(config),
        upstream=upstream,
    )
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print(render_inspection(report, args.request))
    return 0 if report["fits"] else 1


def models(args: argparse.Namespace) -> int:
    from brim.policies.tokens import TokenCounter
    from brim.proxy.app import build_limits

    config = _load(args.config)
    counter = TokenCounter(claude_factor=config.guard.claude_token_factor)
    rows = model_rows(build_limits(config), args.pattern, counter, shared_ratios(config))
    print(json.dumps(rows, indent=2) if args.json else render_models(rows))
    return 0


def archive(args: argparse.Namespace) -> int:
    from brim.middleware.services.archive import ContentArchive

    config = _load(args.config)
    store = ContentArchive(config.archive.dir, config.archive.ttl_hours)
    try:
        key = store.resolve(args.key)
    except ValueError as exc:
        print(f"brim: {exc}", file=sys.stderr)
        return 2
    content = None if key is None else store.get(key)
    if content is None:
        print(f"brim: nothing is archived under {args.key} (or it has expired)", file=sys.stderr)
        return 1
    sys.stdout.write(content)
    return 0


def init(args: argparse.Namespace) -> int:
    """Write the commented default proxy.toml (every key at its default, each explained)."""
    from brim.proxy.resources import default_config_text

    path = Path(args.path)
    if path.is_dir():
        path = path / DEFAULT_CONFIG
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w" if args.force else "x", encoding="utf-8") as file:
            file.write(default_config_text())
    except FileExistsError:
        print(f"brim: {path} exists; brim init --force {args.path} replaces it", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"brim: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"brim: wrote {path}; edit it, then: brim check-config {path}", file=sys.stderr)
    return 0


def version() -> str:
    """brim's version, from the installed package's metadata."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("brim")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _admin_target(args: argparse.Namespace) -> tuple[str, str] | None:
    """The running brim's URL and an admin key, for the commands that ask it; None (said on
    stderr) without a key."""
    from brim.proxy.status_view import ADMIN_KEY_ENV, local_url

    key = args.admin_key or os.environ.get(ADMIN_KEY_ENV)
    if not key:
        print(f"brim: give the admin key with --admin-key or ${ADMIN_KEY_ENV}", file=sys.stderr)
        return None
    url = args.url
    if url is None:
        server = _load(args.config).server
        url = local_url(server.host, server.port)
    return url, key


def status(args: argparse.Namespace) -> int:
    from brim.proxy.status_view import StatusError, fetch_status, render_status

    target = _admin_target(args)
    if target is None:
        return 2
    url, key = target
    try:
        snapshot = fetch_status(url, key)
    except StatusError as exc:
        print(f"brim: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(snapshot, indent=2) if args.json else render_status(snapshot, url))
    return 0


def limits(args: argparse.Namespace) -> int:
    from brim.proxy.limits_view import fetch_limits, forget_limits, render_forgotten, render_limits
    from brim.proxy.status_view import StatusError

    forgetting = args.limits_command == "forget"
    if forgetting and (args.model is None) == (not args.all):
        print("brim: name a MODEL to forget, or --all (not both)", file=sys.stderr)
        return 2
    target = _admin_target(args)
    if target is None:
        return 2
    url, key = target
    try:
        if forgetting:
            answer = forget_limits(url, key, None if args.all else args.model)
        else:
            answer = fetch_limits(url, key)
    except StatusError as exc:
        print(f"brim: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(render_forgotten(answer) if forgetting else render_limits(answer, url))
    return 0


def _admin_options(command: argparse.ArgumentParser, *, sub: bool = False) -> None:
    """The options of a command that asks a running brim's admin endpoints. `sub`: a
    subcommand's, which leave those given before it (`brim limits --url U forget M`) standing."""
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if sub else {}
    command.add_argument(
        "--url", help="brim's base URL (default: [server] host and port)", **default
    )
    command.add_argument("--admin-key", help="an admin key (default: $BRIM_ADMIN_KEY)", **default)
    command.add_argument("--config", help="proxy.toml to use (default as for serve)", **default)
    command.add_argument("--json", action="store_true", help="the answer as JSON", **default)


def reload(args: argparse.Namespace) -> int:
    """Ask the running brim to reload its configuration file (`POST /admin/reload`)."""
    from brim.proxy.status_view import StatusError, admin_call

    target = _admin_target(args)
    if target is None:
        return 2
    url, key = target
    try:
        answer = admin_call(url, key, "/admin/reload", method="POST")
    except StatusError as exc:
        print(f"brim: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    changes = ", ".join(answer.get("changes") or ()) or "nothing"
    print(f"brim: reloading {answer.get('config')}: changes {changes}", file=sys.stderr)
    for key_name in answer.get("needs_restart") or ():
        print(f"brim: {key_name} changed; that takes effect at the next restart", file=sys.stderr)
    return 0


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0-65535)")
    return port


def _workers(text: str) -> int | str:
    try:
        return parse_workers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="brim", description="Keeps every LLM request inside the model's context window."
    )
    root.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = root.add_subparsers(dest="command", required=True)

    run = commands.add_parser("serve", help="run the proxy")
    run.add_argument(
        "--config",
        help="path to proxy.toml (default: $BRIM_CONFIG, else ./proxy.toml if present, "
        "else built-in defaults)",
    )
    run.add_argument("--host", help="listen address (default 127.0.0.1)")
    run.add_argument("--port", type=_port, help="listen port (default 8787; 0 picks a free one)")
    run.add_argument(
        "--workers",
        type=_workers,
        metavar="N",
        help='processes serving the port: a number, or "auto" for one per core '
        "(default: [server] workers, 1)",
    )
    run.add_argument(
        "--log-level",
        choices=LEVELS,
        help=f"default: ${LEVEL_ENV}, else info (info: a line for each request brim changed or "
        "retried; debug: for every request)",
    )
    run.add_argument(
        "--log-format",
        choices=FORMATS,
        help=f"default: ${FORMAT_ENV}, else text (json: one object per line)",
    )
    run.set_defaults(func=serve)

    check = commands.add_parser(
        "check-config",
        help="make the checks serve makes and print the resolved config, secrets masked",
    )
    check.add_argument(
        "config",
        nargs="?",
        metavar="path",
        help="proxy.toml to check (default: found as serve finds it)",
    )
    check.set_defaults(func=check_config)

    look = commands.add_parser(
        "inspect",
        help="show a saved request's limits, budget and token counts (exit 1 if it does not fit)",
    )
    look.add_argument(
        "request",
        help="a request body, as JSON: Chat Completions, Anthropic Messages, Responses or Gemini",
    )
    look.add_argument(
        "--api",
        choices=list(WIRES),
        help="the body's wire API (default: recognised from its shape)",
    )
    look.add_argument(
        "--model", help="count for this model instead of the request's own (Gemini: required)"
    )
    look.add_argument("--config", help="proxy.toml to use (default as for serve)")
    look.add_argument("--user-agent", help="apply the [clients] rule this User-Agent matches")
    look.add_argument("--json", action="store_true", help="machine-readable output")
    look.set_defaults(func=inspect)

    known = commands.add_parser(
        "models", help="resolved limits of configured and known models, with their sources"
    )
    known.add_argument(
        "pattern", nargs="?", help="glob over model ids; a plain word matches anywhere"
    )
    known.add_argument("--config", help="proxy.toml to use (default as for serve)")
    known.add_argument("--json", action="store_true", help="machine-readable output")
    known.set_defaults(func=models)

    kept = commands.add_parser("archive", help="the content archive")
    kept_commands = kept.add_subparsers(dest="archive_command", required=True)
    get = kept_commands.add_parser("get", help="print the original archived under a sha256 key")
    get.add_argument(
        "key",
        help="the key from an audit line or a placeholder: 64 hex digits or a unique prefix of "
        "at least 8, 'sha256:' optional",
    )
    get.add_argument("--config", help="proxy.toml to use (default as for serve)")
    get.set_defaults(func=archive)

    start = commands.add_parser("init", help="write a commented proxy.toml to start from")
    start.add_argument(
        "path", nargs="?", default=DEFAULT_CONFIG, help="file or folder (default: ./proxy.toml)"
    )
    start.add_argument("--force", action="store_true", help="replace a file that exists")
    start.set_defaults(func=init, config=None)

    add_run_command(commands)

    board = commands.add_parser(
        "status", help="a running brim's figures, as /ui shows them (GET /admin/status)"
    )
    _admin_options(board)
    board.set_defaults(func=status)

    learned = commands.add_parser(
        "limits",
        help="the limits a running brim learned from providers' overflow errors "
        "(GET /admin/limits); 'limits forget' forgets them",
    )
    _admin_options(learned)
    learned.set_defaults(func=limits, limits_command=None)
    learned_commands = learned.add_subparsers(dest="limits_command")
    forget = learned_commands.add_parser(
        "forget",
        help="forget what a model taught brim, on every instance and worker sharing it "
        "(DELETE /admin/limits/MODEL)",
    )
    forget.add_argument("model", nargs="?", metavar="MODEL", help="the model id, as listed")
    forget.add_argument("--all", action="store_true", help="forget every model's")
    _admin_options(forget, sub=True)

    again = commands.add_parser(
        "reload",
        help="make a running brim read its configuration file again, as SIGHUP does "
        "(POST /admin/reload)",
    )
    _admin_options(again)
    again.set_defaults(func=reload)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.config = find_config(args.config)  # every command finds its config as serve does
    if args.command == "serve":
        print(f"brim: configuration from {args.config or 'built-in defaults'}", file=sys.stderr)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"brim: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except InspectError as exc:
        print(f"brim: {exc}", file=sys.stderr)
        return 2
    except CannotListen as exc:
        print(f"brim: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
