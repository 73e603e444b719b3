"""deploy/: the docker compose and Kubernetes examples, checked offline (no container engine and no
cluster run here). Each file follows its schema — the Compose Specification, and Kubernetes' own
for each kind, both vendored in tests/schemas/ (see the README there) — and what would break
silently between the files and brim does not: brim starts with the configuration each container
gets (file, image and deployment environment together, every BRIM_ variable a real key), keys are
required and come from the environment, the probes and the load balancer reach brim's routes on
brim's port, and the objects' names, labels and ports fit together."""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from brim.proxy.commands import parser, refuse_open_without_keys, serve
from brim.proxy.config import ENV_NOT_CONFIG, ENV_PREFIX, BrimConfig, load_config
from tests.conftest import BrimFactory

ROOT = Path(__file__).parents[1]
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
SCHEMAS = Path(__file__).parent / "schemas"
KUBE_SCHEMAS = SCHEMAS / "kubernetes" / "v1.30.0-local-strict"
KUBE_MANIFESTS = [*sorted(KUBE.glob("*.yaml")), KUBE / "secret.yaml.example"]


# --- reading the files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    env: dict[str, str]
    command: list[str]
    uid: int


def image() -> Image:
    """The Dockerfile's environment, command and the uid of its USER."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text(encoding="utf-8"))
    env: dict[str, str] = {}
    command: list[str] = []
    uids: dict[str, int] = {}
    user = "root"
    for line in text.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction == "ENV":
            for token in shlex.split(rest):
                key, _, value = token.partition("=")
                env[key] = value
        elif instruction == "CMD":
            command = json.loads(rest)
        elif instruction == "USER":
            user = rest.strip()
        elif instruction == "RUN" and (found := re.search(r"useradd .*--uid (\d+) (\w+)", rest)):
            uids[found[2]] = int(found[1])
    return Image(env, command, int(user) if user.isdigit() else uids.get(user, 0))


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    return loaded


def brim_services(project: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The compose services built from the repository's Dockerfile."""
    built = {}
    for name, service in project["services"].items():
        build = service.get("build")
        context = build if isinstance(build, str) else (build or {}).get("context")
        if context is not None and (DEPLOY / context).resolve() == ROOT:
            built[name] = service
    return built


INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: Any, host: Mapping[str, str]) -> Any:
    """Compose's `${NAME}`, `${NAME:-default}` and `${NAME:?error}`, over a whole document."""
    if isinstance(value, dict):
        return {key: interpolate(item, host) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, host) for item in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        given = host.get(name)
        empty = given is None or (given == "" and op is not None and op.startswith(":"))
        if op is not None and op.endswith("?") and empty:
            raise LookupError(f"compose refuses to start: {name}: {arg}")
        if op is not None and op.endswith("-") and empty:
            return str(arg)
        return given or ""

    return INTERPOLATION.sub(one, value)


def required_variables(project: Mapping[str, Any]) -> set[str]:
    text = json.dumps(project)
    return {m["name"] for m in INTERPOLATION.finditer(text) if m["op"] in (":?", "?")}


def host_environment(project: Mapping[str, Any]) -> dict[str, str]:
    """The shell `docker compose up` runs in: each required variable set, nothing else."""
    return {name: f"test-{name.lower()}" for name in required_variables(project)}


def kube_documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in KUBE_MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


def kube_object(kind: str, name: str) -> dict[str, Any]:
    matches = [
        d for _, d in kube_documents() if d["kind"] == kind and d["metadata"]["name"] == name
    ]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} in deploy/kubernetes/"
    return matches[0]


def pod_spec(deployment: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def pod_labels(deployment: Mapping[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def brim_container() -> dict[str, Any]:
    (container,) = pod_spec(kube_object("Deployment", "brim"))["containers"]
    return dict(container)


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def container_port(container: Mapping[str, Any], port: int | str) -> int:
    """A probe's or a Service's port, by number or by the container port's name."""
    for declared in container.get("ports", []):
        if port in (declared["containerPort"], declared.get("name")):
            return int(declared["containerPort"])
    raise AssertionError(f"port {port!r} is not a port of container {container['name']}")


# --- brim as each container starts it ------------------------------------------------------------


@dataclass(frozen=True)
class Container:
    env: dict[str, str]  # the environment brim sees: the image's, then the deployment's
    written: dict[str, Any]  # the deployment's own environment entries, as the file has them
    command: list[str]
    config_text: str  # the file $BRIM_CONFIG names, as the container sees it


def compose_container(service_name: str) -> Container:
    project = compose()
    host = host_environment(project)
    service = brim_services(project)[service_name]
    written = dict(service.get("environment") or {})
    env = {**image().env, **{k: str(v) for k, v in interpolate(written, host).items()}}
    assert not [k for k, v in env.items() if "$" in v], "an interpolation this test does not know"
    config_path = env["BRIM_CONFIG"]
    mounted = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        mounted[target] = (DEPLOY / source).resolve()
    assert config_path in mounted, f"{service_name}: nothing is mounted at {config_path}"
    command = service.get("command") or image().command
    return Container(env, written, list(command), mounted[config_path].read_text(encoding="utf-8"))


def kube_container() -> Container:
    deployment = kube_object("Deployment", "brim")
    container = brim_container()
    written = {entry["name"]: entry for entry in container.get("env", [])}
    env = dict(image().env)
    for name, entry in written.items():
        if "value" in entry:
            env[name] = str(entry["value"])
        else:  # a Secret's key: some non-empty value (what a real Secret holds is checked below)
            env[name] = f"test-{entry['valueFrom']['secretKeyRef']['key'].lower()}"
    config_path = Path(env["BRIM_CONFIG"])
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod_spec(deployment).get("volumes", [])}
    volume = volumes[mounts[str(config_path.parent)]]
    config_map = kube_object("ConfigMap", volume["configMap"]["name"])
    command = [*(container.get("command") or image().command), *container.get("args", [])]
    return Container(env, written, command, config_map["data"][config_path.name])


def container_at(where: str) -> Container:
    platform, _, name = where.partition(":")
    return kube_container() if platform == "kubernetes" else compose_container(name)


CONTAINERS = [*(f"compose:{name}" for name in brim_services(compose())), "kubernetes:brim"]


def load_in(container: Container) -> tuple[BrimConfig, list[str]]:
    """brim's configuration as `brim serve` builds it inside the container: its file, its
    environment and nothing of this machine's, then the command line's --host and --port."""
    args = parser().parse_args(container.command[1:])
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        path = Path(folder) / "proxy.toml"
        path.write_text(container.config_text, encoding="utf-8")
        patch.setattr(os, "environ", dict(container.env))
        config, warnings = load_config(path)
    flags = {key: value for key, value in (("host", args.host), ("port", args.port)) if value}
    server = config.server.model_copy(update=flags)
    return config.model_copy(update={"server": server}), warnings


def secret_variables(config: BrimConfig) -> set[str]:
    """The environment variables brim reads keys from (`…_env` in the file)."""
    names = {config.server.api_keys_env, config.server.admin_keys_env}
    names |= {upstream.api_key_env for upstream in config.upstreams.values()}
    return {name for name in names if name}


def brim_port() -> int:
    """The port brim listens on in its containers."""
    config, _ = load_in(kube_container())
    return config.server.port


# --- schemas -------------------------------------------------------------------------------------


def kube_registry() -> Registry:
    resources = [
        Resource.from_contents(json.loads(path.read_text(encoding="utf-8")))
        for path in sorted(KUBE_SCHEMAS.glob("*.json"))
    ]
    return Registry().with_resources((str(r.id()), r) for r in resources)


def kube_schema_file(doc: Mapping[str, Any]) -> Path:
    """kind-group-version.json (core kinds: kind-version.json), as the schemas are named."""
    group, _, version = doc["apiVersion"].rpartition("/")
    parts = [doc["kind"].lower(), group.split(".")[0], version]
    return KUBE_SCHEMAS / ("-".join(p for p in parts if p) + ".json")


def test_the_compose_file_follows_the_compose_specification() -> None:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text(encoding="utf-8"))
    project = compose()
    resolved = interpolate(project, host_environment(project))  # compose checks after this
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in Draft202012Validator(schema).iter_errors(resolved)
    ]
    assert not errors, errors


@pytest.mark.parametrize(("where", "doc"), kube_documents(), ids=[w for w, _ in kube_documents()])
def test_kubernetes_manifests_follow_the_kubernetes_schema(where: str, doc: dict[str, Any]) -> None:
    path = kube_schema_file(doc)
    assert path.is_file(), f"{where}: no schema vendored for {doc['apiVersion']} {doc['kind']}"
    schema = json.loads(path.read_text(encoding="utf-8"))
    validator = Draft202012Validator(schema, registry=kube_registry())
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]
    assert not errors, errors


def references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from references(value)
    elif isinstance(node, list):
        for item in node:
            yield from references(item)


def test_the_vendored_kubernetes_schemas_are_whole_and_all_used() -> None:
    """Trimmed to the kinds deploy/ uses: every reference in them resolves (a validation only
    follows the ones a manifest reaches), and no schema is kept that no manifest uses."""
    registry = kube_registry()
    files = sorted(KUBE_SCHEMAS.glob("*.json"))
    assert len(files) > 1
    for path in files:
        schema = json.loads(path.read_text(encoding="utf-8"))
        resolver = registry.resolver(base_uri=schema["$id"])
        for ref in set(references(schema)):
            resolver.lookup(ref)  # raises if the trimmed definitions lack it
    used = {kube_schema_file(doc) for _, doc in kube_documents()}
    assert used == {p for p in files if p.name != "_definitions.json"}


# --- brim inside the containers ------------------------------------------------------------------


def test_the_image_runs_brim_serve() -> None:
    assert image().command[:2] == ["brim", "serve"]
    for service in brim_services(compose()).values():
        assert service.get("command") in (None, image().command), "compose overrides brim serve"
    container = brim_container()
    assert "command" not in container or container["command"][:2] == ["brim", "serve"]


def test_both_examples_run_the_image_the_build_script_makes() -> None:
    """deploy/build-image.sh tags `brim:<version>`; compose builds and names that tag, and the
    Deployment runs it."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "version"
    ]
    script = (DEPLOY / "build-image.sh").read_text(encoding="utf-8")
    default = re.search(r'tag="\$\{BRIM_IMAGE:-(?P<tag>[^}]+)\}"', script)
    assert default is not None, "build-image.sh names no default tag"
    tag = default["tag"].replace("$version", version)
    assert tag == f"brim:{version}"
    assert os.access(DEPLOY / "build-image.sh", os.X_OK)
    services = brim_services(compose())
    assert services and {service["image"] for service in services.values()} == {tag}
    assert brim_container()["image"] == tag
    # The image's base is a build argument, the official python image by default.
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "ARG BASE=python:3.11-slim" in dockerfile and "FROM ${BASE}" in dockerfile


@pytest.mark.parametrize("where", CONTAINERS)
def test_brim_starts_in_each_container_with_keys_required(where: str) -> None:
    inside = container_at(where)
    assert inside.command[0] == "brim"
    assert parser().parse_args(inside.command[1:]).func is serve
    config, warnings = load_in(inside)

    assert warnings == [], warnings  # no unknown key, BRIM_SERVER__WORKERS included

    # Every BRIM_ variable that is configuration sets its key (a secret's variable is read by
    # name; BRIM_CONFIG and the like are not configuration).
    settings = config.model_dump(mode="json")
    for name, value in inside.env.items():
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_CONFIG:
            continue
        if name in secret_variables(config):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        node: Any = settings
        for part in path:
            assert isinstance(node, dict) and part in node, f"{name}: no key {'.'.join(path)}"
            node = node[part]
        assert str(node).lower() == value.lower(), f"{name}={value} but the config has {node!r}"

    # Reachable from other containers, and only with a key.
    assert config.server.host == "0.0.0.0"
    assert not config.server.allow_unauthenticated
    assert config.server.api_keys and config.server.admin_keys
    refuse_open_without_keys(config)
    # brim holds a key for every provider it sends to.
    assert all(upstream.api_key for upstream in config.upstreams.values())
    # The instances share one Redis.
    assert config.cache.url and urlsplit(config.cache.url).scheme == "redis"


def test_secrets_come_from_the_environment_not_the_files() -> None:
    project = compose()
    for name in brim_services(project):
        container = compose_container(name)
        config, _ = load_in(container)
        for variable in secret_variables(config):
            written = container.written.get(variable)
            assert isinstance(written, str), f"{name}: {variable} is not passed in"
            assert re.fullmatch(rf"\$\{{{variable}:\?[^}}]*\}}", written), (
                f"{name}: {variable} must come from the shell or .env, required: {written!r}"
            )

    kube = kube_container()
    config, _ = load_in(kube)
    secret = kube_object("Secret", "brim-secrets")
    assert secret_variables(config)
    for variable in secret_variables(config):
        entry = kube.written.get(variable)
        assert entry is not None, f"kubernetes: {variable} is not passed in"
        reference = entry.get("valueFrom", {}).get("secretKeyRef")
        assert reference, f"kubernetes: {variable} must come from a Secret"
        assert reference["name"] == secret["metadata"]["name"]
        assert reference["key"] in secret["stringData"]
    assert "data" not in secret
    assert set(secret["stringData"].values()) == {""}, "the example Secret holds a value"


# --- probes, ports and the load balancer ---------------------------------------------------------


def test_the_probes_reach_brims_health_routes_on_its_port(brim: BrimFactory) -> None:
    port = brim_port()
    container = brim_container()
    probes = {
        "readinessProbe": container["readinessProbe"]["httpGet"],
        "livenessProbe": container["livenessProbe"]["httpGet"],
    }
    # Ready is what takes a pod in and out of the Service; alive only says the process serves.
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    for probe in probes.values():
        assert container_port(container, probe["port"]) == port

    compose_probes = []
    for name, service in brim_services(compose()).items():
        url = re.search(r"http://[\w.]+:(\d+)(/\w*)", " ".join(service["healthcheck"]["test"]))
        assert url, f"{name}: its healthcheck calls no URL"
        assert int(url[1]) == port
        compose_probes.append(url[2])
    assert set(compose_probes) == {"/readyz"}  # the load balancer waits until both are ready

    base = brim()
    for path in {*compose_probes, *(p["path"] for p in probes.values())}:
        assert httpx.get(f"{base}{path}").status_code == 200, path


Directive = tuple[str, list[str], list[Any] | None]  # name, arguments, block (None: none)


def nginx(text: str) -> list[Directive]:
    tokens = re.findall(r"\"[^\"]*\"|'[^']*'|[{};]|[^\s{};]+", re.sub(r"#[^\n]*", "", text))
    position = 0

    def block() -> list[Directive]:
        nonlocal position
        found: list[Directive] = []
        words: list[str] = []
        while position < len(tokens):
            token = tokens[position]
            position += 1
            if token == ";":
                found.append((words[0], words[1:], None))
                words = []
            elif token == "{":
                found.append((words[0], words[1:], block()))
                words = []
            elif token == "}":
                return found
            else:
                words.append(token)
        assert not words, f"nginx.conf ends inside {words}"
        return found

    return block()


def directive(scopes: list[list[Directive]], name: str) -> list[str]:
    """A directive's arguments where nginx takes them: the innermost scope that sets it."""
    for scope in reversed(scopes):
        for found, args, _ in scope:
            if found == name:
                return args
    raise AssertionError(f"nginx.conf: no {name}")


def children(scope: list[Directive], name: str) -> list[tuple[list[str], list[Directive]]]:
    return [(args, inner) for found, args, inner in scope if found == name and inner is not None]


def seconds(text: str) -> float:
    """An nginx or compose duration: 3600s, 1h, 30s, 600."""
    found = re.fullmatch(r"(\d+)(ms|s|m|h|d)?", text)
    assert found, f"not a duration: {text!r}"
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[found[2] or "s"]
    return int(found[1]) * scale


def cores(quantity: str | int) -> float:
    """A Kubernetes CPU quantity: 2, "2", "1.5", "500m"."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)(m?)", str(quantity))
    assert found, f"not a CPU quantity: {quantity!r}"
    return float(found[1]) / (1000 if found[2] else 1)


def megabytes(text: str) -> float:
    """An nginx size: 32m, 1g, 512k, 1048576."""
    found = re.fullmatch(r"(\d+)([kKmMgG])?", text)
    assert found, f"not a size: {text!r}"
    return (
        int(found[1])
        * {"k": 1 / 1024, "m": 1, "g": 1024, "": 1 / 1024**2}[(found[2] or "").lower()]
    )


def test_the_load_balancer_sends_to_every_brim_instance_and_lets_streams_run() -> None:
    project = compose()
    instances = brim_services(project)
    assert len(instances) >= 2
    config, _ = load_in(compose_container(next(iter(instances))))

    lb = project["services"]["lb"]
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in lb["volumes"]
    assert set(lb["depends_on"]) == set(instances)
    top = nginx((DEPLOY / "nginx.conf").read_text(encoding="utf-8"))
    ((_, http),) = children(top, "http")
    ((_, server),) = children(http, "server")
    published = interpolate(lb["ports"], host_environment(project))
    assert [p.rsplit(":", 1)[1] for p in published] == directive([server], "listen")

    ((_, location),) = [(a, inner) for a, inner in children(server, "location") if a == ["/"]]
    scopes = [http, server, location]
    target = urlsplit(directive(scopes, "proxy_pass")[0])
    upstreams = {args[0]: inner for args, inner in children(http, "upstream")}
    assert target.hostname in upstreams, f"proxy_pass goes to {target.hostname}, no upstream"
    servers = [args[0] for name, args, _ in upstreams[target.hostname] if name == "server"]
    assert sorted(servers) == sorted(f"{name}:{config.server.port}" for name in instances)

    # Streaming: events pass as brim sends them, and brim's own timeouts end a slow reply, in the
    # client's format, before nginx would cut the connection.
    assert directive(scopes, "proxy_buffering") == ["off"]
    longest_wait = max(u.timeout_s for u in config.upstreams.values())
    assert seconds(directive(scopes, "proxy_read_timeout")[0]) >= longest_wait
    assert megabytes(directive(scopes, "client_max_body_size")[0]) >= config.server.max_body_mb


def test_compose_waits_for_redis_and_gives_streams_time_to_finish() -> None:
    project = compose()
    for name, service in brim_services(project).items():
        config, _ = load_in(compose_container(name))
        redis = urlsplit(config.cache.url or "")
        assert redis.hostname in project["services"], f"{name}: no {redis.hostname} service"
        assert service["depends_on"][redis.hostname]["condition"] == "service_healthy"
        assert seconds(service["stop_grace_period"]) > config.server.shutdown_timeout_s


# --- the Kubernetes objects together -------------------------------------------------------------


def test_the_kubernetes_objects_fit_together() -> None:
    brim = kube_object("Deployment", "brim")
    redis = kube_object("Deployment", "redis")
    container = brim_container()
    config, _ = load_in(kube_container())

    assert brim["spec"]["replicas"] == 2
    for deployment in (brim, redis):
        assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels(deployment))

    # Each Service reaches its own pods, on a port their container listens on.
    service = kube_object("Service", "brim")
    assert selects(service["spec"]["selector"], pod_labels(brim))
    assert not selects(service["spec"]["selector"], pod_labels(redis))
    for port in service["spec"]["ports"]:
        assert container_port(container, port["targetPort"]) == config.server.port
    redis_service = kube_object("Service", "redis")
    assert selects(redis_service["spec"]["selector"], pod_labels(redis))
    assert not selects(redis_service["spec"]["selector"], pod_labels(brim))
    url = urlsplit(config.cache.url or "")
    assert url.hostname == redis_service["metadata"]["name"]
    ports = {p["port"]: p["targetPort"] for p in redis_service["spec"]["ports"]}
    assert (url.port or 6379) in ports, f"{config.cache.url}: the redis Service has no such port"
    (redis_container,) = pod_spec(redis)["containers"]
    assert container_port(redis_container, ports[url.port or 6379]) == 6379

    # Each worker process a core of the pod's CPU limit ("auto" would count the node's cores).
    workers = kube_container().env["BRIM_SERVER__WORKERS"]
    assert workers.isdigit(), f"BRIM_SERVER__WORKERS={workers}: give the pod's core count"
    assert 1 <= int(workers) <= cores(container["resources"]["limits"]["cpu"])

    # A drain never takes both replicas.
    budget = kube_object("PodDisruptionBudget", "brim")
    assert selects(budget["spec"]["selector"]["matchLabels"], pod_labels(brim))
    assert budget["spec"]["minAvailable"] < brim["spec"]["replicas"]

    # One configuration for both examples.
    config_map = kube_object("ConfigMap", "brim-config")
    assert config_map["data"]["proxy.toml"] == (DEPLOY / "proxy.toml").read_text(encoding="utf-8")

    # The image's user, so that runAsNonRoot can be checked by the kubelet at all.
    security = pod_spec(brim)["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == image().uid != 0

    # Stopping: the Service lets go of the pod (preStop), then in-flight streams get
    # shutdown_timeout_s, all within the grace period.
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    grace = pod_spec(brim)["terminationGracePeriodSeconds"]
    assert grace > int(pause[1]) + config.server.shutdown_timeout_s
