"""The import rules between the four packages (docs/architecture.md), checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
FORBIDDEN = {
    "policies": {"proxy", "middleware", "adapters"},
    "adapters": {"proxy", "middleware"},
    "middleware": {"proxy"},
}


def imported_packages(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_the_layering(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    for path in files:
        bad = imported_packages(path) & FORBIDDEN[package]
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_litellm_is_imported_lazily_only() -> None:
    for package in ("proxy", "middleware", "adapters", "policies"):
        for path in (ROOT / package).rglob("*.py"):
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
