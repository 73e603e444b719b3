"""The layout (docs/architecture.md), checked on the source: the one import package `brim` and
the import rules between its four parts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PARTS = ("proxy", "middleware", "adapters", "policies")  # brim.X, in the folder X/
FORBIDDEN = {
    "brim.policies": {"brim.proxy", "brim.middleware", "brim.adapters"},
    "brim.adapters": {"brim.proxy", "brim.middleware"},
    "brim.middleware": {"brim.proxy"},
}


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports by its absolute name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def part_of(module: str) -> str:
    """`brim.middleware.stages.guard` → `brim.middleware`; anything else as it is."""
    return ".".join(module.split(".")[:2]) if module.startswith("brim.") else module


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_the_layering(package: str) -> None:
    files = sorted((ROOT / package.removeprefix("brim.")).rglob("*.py"))
    assert files, f"{package} has no modules"
    for path in files:
        bad = {part_of(module) for module in imported_modules(path)} & FORBIDDEN[package]
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_parts_are_imported_as_brim_only() -> None:
    """`from proxy.app import …` would work from the repository's root (tests run there) and
    load a second copy of the module beside `brim.proxy.app`: nothing imports the folders by
    their own names."""
    sources = [ROOT / part for part in (*PARTS, "tests", "bench")]
    files = sorted(path for folder in sources for path in folder.rglob("*.py"))
    assert len(files) > 100
    for path in files:
        bare = {m for m in imported_modules(path) if m.split(".")[0] in PARTS}
        assert not bare, f"{path.relative_to(ROOT)} imports {sorted(bare)}: import brim.…"


def test_litellm_is_imported_lazily_only() -> None:
    for part in PARTS:
        for path in (ROOT / part).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in tree.body:  # module level only: inside functions is the lazy import
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                assert not any(n.split(".")[0] == "litellm" for n in names), path


def test_the_import_links_are_the_four_folders() -> None:
    """.pythonpath/brim/ (what mypy and a subprocess of this checkout import `brim` from) links
    to the four folders, and holds nothing else."""
    links = ROOT / ".pythonpath" / "brim"
    assert sorted(entry.name for entry in links.iterdir()) == sorted(PARTS)
    for part in PARTS:
        assert (links / part).is_symlink() and (links / part).resolve() == ROOT / part


def test_no_two_modules_share_a_basename() -> None:
    """A module's name says what it is: `cli.py` in two places (a provider, brim's command line)
    made readers guess. `__init__`/`__main__` repeat by nature; `policies/wires/base.py` is the
    wires' base."""
    seen: dict[str, Path] = {}
    for part in PARTS:
        for path in sorted((ROOT / part).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if path.name in ("__init__.py", "__main__.py") or relative.as_posix() == (
                "policies/wires/base.py"
            ):
                continue
            assert path.name not in seen, f"{relative} and {seen[path.name]} share a name"
            seen[path.name] = relative
