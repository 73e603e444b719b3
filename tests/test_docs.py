"""The documentation is true and whole: every relative link and `#anchor` in README.md,
CHANGELOG.md and docs/*.md resolves (anchors as GitHub makes them from headings), the README's
two commands are the ones dev.sh and CI run, every configuration key is in the configuration
reference with its real default, every `brim` command and option is in the command reference,
and neither the README nor docs/ narrates history by commit."""

from __future__ import annotations

import argparse
import json
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from brim.proxy.commands import parser
from brim.proxy.config import BrimConfig

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted([README, ROOT / "CHANGELOG.md", *DOCS.glob("*.md"), ROOT / "deploy" / "README.md"])
README_MAX_LINES = 400

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) for every line outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def heading_text(markdown: str) -> str:
    """A heading's text as rendered: code spans as their content, links as their text,
    emphasis markers gone."""
    text = INLINE_CODE.sub(lambda m: m.group(2).strip(), markdown)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"(\*\*|__|\*)", "", text)


def slug(text: str) -> str:
    """GitHub's anchor for a heading: lower case; every character that is not a letter, mark,
    number, connector (`_`), space or hyphen removed; each space a hyphen."""
    kept = "".join(
        c for c in text.lower() if c in " -" or unicodedata.category(c)[0] in "LMN" or c == "_"
    )
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor the page's headings make, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(heading_text(match.group(2)))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, target) of every inline link and image outside code."""
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            yield number, match.group(1)


def test_the_pages_exist() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in PAGES}
    for page in (
        "README.md",
        "CHANGELOG.md",
        "docs/configuration.md",
        "docs/guard.md",
        "docs/observability.md",
        "docs/deployment.md",
        "docs/reliability.md",
        "docs/security.md",
        "docs/benchmarks.md",
        "docs/architecture.md",
    ):
        assert page in names and (ROOT / page).is_file(), page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken: list[str] = []
    for number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.is_relative_to(ROOT):
            broken.append(f"{where} (outside the repository)")
            continue
        if not resolved.exists():
            broken.append(f"{where} (no such file)")
            continue
        if anchor:
            if resolved.suffix != ".md":
                broken.append(f"{where} (an anchor into a file that is not markdown)")
            elif anchor not in anchors(resolved):
                broken.append(f"{where} (no heading makes #{anchor})")
    assert not broken, "\n".join(broken)


def test_slugs_are_githubs() -> None:
    assert slug(heading_text("`brim run`: one command, nothing to configure")) == (
        "brim-run-one-command-nothing-to-configure"
    )
    assert slug(heading_text("Shared state (Redis)")) == "shared-state-redis"
    assert slug(heading_text("`[server.key_limits.NAME]`")) == "serverkey_limitsname"
    assert slug(heading_text("Several processes on one port: `--workers`")) == (
        "several-processes-on-one-port---workers"
    )
    assert slug(heading_text("Nothing cut is lost: `brim_restore`")) == (
        "nothing-cut-is-lost-brim_restore"
    )


def test_a_broken_anchor_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Same\n\n## Same\n\n[x](#same-1) [y](#same-2)\n```\n# not one\n```\n"
    )
    assert anchors(page) == {"title", "same", "same-1"}
    assert [target for _, target in links(page)] == ["#same-1", "#same-2"]


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    linked = {target.partition("#")[0] for _, target in links(README)}
    for page in sorted(DOCS.glob("*.md")):
        assert f"docs/{page.name}" in linked, f"the README does not link docs/{page.name}"


def test_the_two_commands_are_the_readmes_dev_shs_and_cis() -> None:
    """A new user needs exactly two commands after cloning; the README shows them, dev.sh does
    them, and CI tests with the same one."""
    text = README.read_text(encoding="utf-8")
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", quick, re.S)
    assert block, "the Quick start has no sh block"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert [c for c in commands if c] == ["./dev.sh serve", "./dev.sh test"]
    dev = (ROOT / "dev.sh").read_text(encoding="utf-8")
    assert re.search(r"^  serve\)\n    setup\n    exec \"\$venv/bin/brim\" serve", dev, re.M)
    assert re.search(
        r"^  test\)\n    setup\n.*?exec \"\$venv/bin/python\" -m pytest", dev, re.M | re.S
    )
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^\./dev\.sh test\b", ci, re.M), ".ci/run does not run ./dev.sh test"


COMMIT = re.compile(r"(?<![\w:/.-])[0-9a-f]{7,40}(?![\w-])")


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_no_commit_hashes(page: Path) -> None:
    """The README and docs/ describe brim as it is; history (by version and date, never by
    commit) is CHANGELOG.md's. Code blocks (sample output) are not looked at."""
    found = [
        f"{page.name}:{number}: {match.group(0)}"
        for number, line in prose_lines(page.read_text(encoding="utf-8"))
        for match in COMMIT.finditer(line)
        if re.search(r"[a-f]", match.group(0)) and re.search(r"\d", match.group(0))
    ]
    assert not found, "\n".join(found)


# The configuration reference: one table per section, `| `key` | default | … |`.

CONFIGURATION = DOCS / "configuration.md"


def sections(model: type[BaseModel], path: str) -> Iterator[tuple[str, type[BaseModel]]]:
    """(section, model) for `model` and every table under it; a table of named entries
    (`[upstreams.NAME]`) is written with `*` for the name."""
    yield path, model
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from sections(annotation, f"{path}.{name}".lstrip("."))
        elif get_origin(annotation) is dict:
            item = get_args(annotation)[1]
            if isinstance(item, type) and issubclass(item, BaseModel):
                yield from sections(item, f"{path}.{name}.*".lstrip("."))


def rows(model: type[BaseModel]) -> dict[str, Any]:
    """The keys a section's table must have, with their defaults (or `required`)."""
    found: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if field.exclude or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            continue
        if get_origin(annotation) is dict:
            item = get_args(annotation)[1]
            if isinstance(item, type) and issubclass(item, BaseModel):
                continue
        if field.default is not PydanticUndefined:
            found[name] = field.default
        elif field.default_factory is not None:
            found[name] = field.default_factory()  # type: ignore[call-arg]
        else:
            found[name] = PydanticUndefined
    return found


def toml_value(value: Any) -> str:
    """A default as it is written in the reference."""
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{'true' if value else 'false'}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def documented_sections() -> dict[str, dict[str, str]]:
    """The reference's tables: section (names as `*`) → key → its default cell."""
    found: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for _, line in prose_lines(CONFIGURATION.read_text(encoding="utf-8")):
        heading = HEADING.match(line)
        if heading:
            bracket = re.fullmatch(r"`\[([^\]]+)\]`", heading.group(2).strip())
            current = None
            if bracket:
                parts = re.findall(r'"[^"]*"|[^.]+', bracket.group(1))
                name = ".".join("*" if p.isupper() or p.startswith('"') else p for p in parts)
                current = found.setdefault(name, {})
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        key = re.fullmatch(r"`(\w+)`", cells[0]) if len(cells) >= 3 else None
        if current is not None and key:
            assert key.group(1) not in current, f"{key.group(1)} twice in one table"
            current[key.group(1)] = cells[1]
    return found


def test_every_configuration_key_is_documented_with_its_default() -> None:
    documented = documented_sections()
    expected = dict(sections(BrimConfig, ""))
    expected.pop("")  # the top level: its tables are the sections
    expected["routes"] = BaseModel  # a table of globs, no fixed keys
    assert set(documented) == set(expected), "sections in docs/configuration.md"
    problems: list[str] = []
    for section, model in expected.items():
        table = documented[section]
        keys = rows(model) if model is not BaseModel else {}
        for key, default in keys.items():
            if key not in table:
                problems.append(f"[{section}] {key}: missing")
            elif not table[key].startswith(toml_value(default)):
                problems.append(f"[{section}] {key}: documented {table[key]!r}, is {default!r}")
        problems += [f"[{section}] {key}: no such key" for key in set(table) - set(keys)]
    assert not problems, "\n".join(problems)


def test_the_configuration_reference_check_catches_a_wrong_default() -> None:
    assert toml_value(8787) == "`8787`"
    assert toml_value(1.0) == "`1`" and toml_value(0.05) == "`0.05`"
    assert toml_value(("a", "b")) == '`["a", "b"]`' and toml_value(()) == "`[]`"
    assert toml_value(None) == "unset" and toml_value(False) == "`false`"
    table = documented_sections()["server"]
    assert table["port"] == "`8787`" and not table["port"].startswith(toml_value(8788))


# The command reference: every `brim` command and option, under the command's heading.

COMMANDS = DOCS / "commands.md"


def subcommands(
    command: argparse.ArgumentParser, prefix: str = "brim"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", sub
                yield from subcommands(sub, f"{prefix} {name}")


def test_every_command_and_option_is_in_the_command_reference() -> None:
    text = COMMANDS.read_text(encoding="utf-8")
    by_heading: dict[str, str] = {}
    heading = ""
    for _, line in prose_lines(text):
        match = HEADING.match(line)
        if match:
            heading = heading_text(match.group(2))
            by_heading.setdefault(heading, "")
        else:
            by_heading[heading] = by_heading.get(heading, "") + line + "\n"
    missing: list[str] = []
    found = 0
    for name, command in subcommands(parser()):
        if any(isinstance(a, argparse._SubParsersAction) for a in command._actions):
            continue  # `brim archive`: its commands are documented one by one
        found += 1
        section = next((body for title, body in by_heading.items() if title.startswith(name)), None)
        if section is None:
            missing.append(f"{name}: no heading")
            continue
        for action in command._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" and option not in section:
                    missing.append(f"{name} {option}")
    assert found >= 8
    assert not missing, "\n".join(missing)
    assert "brim --version" in text
