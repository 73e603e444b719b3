"""What an installed brim carries: `brim --version`, `brim init` and its packaged proxy.toml,
the LICENSE, and the wheel's metadata and files — the last by building a real wheel, checking
that `brim` is the only name it puts in site-packages, and running `brim` from a fresh
virtualenv it is installed into (~15 s: see
`test_a_wheel_has_the_metadata_and_files_and_its_brim_runs`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from importlib.metadata import version
from pathlib import Path

import pytest

from brim.proxy.config import load_config
from brim.proxy.resources import default_config_text

ROOT = Path(__file__).parents[1]
BRIM = str(Path(sys.executable).with_name("brim"))
PACKAGED = ROOT / "proxy" / "proxy.toml"


def brim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BRIM, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=os.environ
    )


def test_the_packaged_proxy_toml_is_the_repositorys() -> None:
    assert PACKAGED.read_bytes() == (ROOT / "proxy.toml").read_bytes(), (
        "proxy/proxy.toml is what `brim init` writes, and must be ./proxy.toml: "
        "cp proxy.toml proxy/proxy.toml"
    )
    assert default_config_text() == (ROOT / "proxy.toml").read_text("utf-8")


def test_version_is_the_installed_packages() -> None:
    done = brim("--version", cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"brim {version('brim')}\n"


def test_init_writes_the_commented_proxy_toml_that_brim_loads(tmp_path: Path) -> None:
    done = brim("init", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = tmp_path / "proxy.toml"
    assert "wrote proxy.toml" in done.stderr and "brim check-config proxy.toml" in done.stderr
    assert written.read_bytes() == (ROOT / "proxy.toml").read_bytes()
    config, warnings = load_config(str(written))
    assert warnings == []
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8787)
    assert "openai" in config.upstreams
    checked = brim("check-config", "proxy.toml", cwd=tmp_path)
    assert checked.returncode == 0 and "proxy.toml: OK" in checked.stderr


def test_init_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    mine = tmp_path / "proxy.toml"
    mine.write_text("[server]\nport = 9000\n")
    refused = brim("init", cwd=tmp_path)
    assert refused.returncode == 1
    assert "proxy.toml exists; brim init --force proxy.toml replaces it" in refused.stderr
    assert mine.read_text() == "[server]\nport = 9000\n"
    forced = brim("init", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert mine.read_bytes() == (ROOT / "proxy.toml").read_bytes()


def test_init_takes_a_path_or_a_folder(tmp_path: Path) -> None:
    done = brim("init", "conf/brim.toml", cwd=tmp_path)  # missing folders are made
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "conf" / "brim.toml").read_bytes() == (ROOT / "proxy.toml").read_bytes()
    done = brim("init", "conf", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "conf" / "proxy.toml").read_bytes() == (ROOT / "proxy.toml").read_bytes()


def test_the_license_is_apache_2_0_as_pyproject_says() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in text
    assert not any(c.startswith("License ::") for c in project["classifiers"])  # PEP 639


SOURCES = ("pyproject.toml", "README.md", "LICENSE", "proxy.toml")
PACKAGES = ("proxy", "middleware", "adapters", "policies")


@pytest.mark.timeout(180)
def test_a_wheel_has_the_metadata_and_files_and_its_brim_runs(tmp_path: Path) -> None:
    """Build a wheel from a copy of the sources (pip, with the build backend pyproject names:
    setuptools from the package index), install it without dependencies into a fresh
    virtualenv whose dependencies come from this one, and run its `brim` there."""
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        shutil.copy(ROOT / name, source / name)
    # tests/ and bench/ too: what keeps them out of the wheel is pyproject's package list.
    for name in (*PACKAGES, "tests", "bench"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    # A version of its own, so that `brim --version` shows it comes from this wheel's metadata.
    pyproject = source / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.1.0+w"'))
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", ".", "-w", str(dist)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("brim-*.whl")

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = "brim-0.1.0+w.dist-info"
        metadata = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
        license_text = archive.read(f"{info}/licenses/LICENSE")
        packaged = archive.read("brim/proxy/proxy.toml")
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    # One name in site-packages, `brim` (no `proxy`, `adapters`, ... of its own), holding every
    # module of the four folders (pyproject's package list misses none).
    assert {name.split("/")[0] for name in names} == {"brim", info}, sorted(names)[:20]
    modules = {
        f"brim/{path.relative_to(ROOT).as_posix()}"
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    assert modules and modules <= names, sorted(modules - names)
    assert "brim/__init__.py" not in names  # a namespace package: brim.* may come from elsewhere
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert license_text == (ROOT / "LICENSE").read_bytes()
    classifiers = metadata.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Topic :: Internet :: Proxy Servers" in classifiers
    assert metadata["Requires-Python"] == ">=3.11"
    assert packaged == (ROOT / "proxy.toml").read_bytes()
    ui = {path.name for path in (ROOT / "proxy" / "ui").iterdir() if not path.name.startswith(".")}
    assert ui and {f"brim/proxy/ui/{name}" for name in ui} <= names  # /ui works from a wheel
    assert "brim = brim.proxy.commands:main" in entry_points

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # brim's dependencies from this environment, after the wheel's own packages on sys.path
    # (a plain path entry: this environment's editable brim is not picked up from there).
    ours = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "dependencies.pth").write_text(ours + "\n")
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    work = tmp_path / "work"
    work.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(venv / "bin" / "brim"), *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=work,
            env=env,
        )

    shown = run("--version")
    assert shown.returncode == 0 and shown.stdout == "brim 0.1.0+w\n", shown.stdout + shown.stderr
    init = run("init")
    assert init.returncode == 0, init.stderr
    assert (work / "proxy.toml").read_bytes() == (ROOT / "proxy.toml").read_bytes()
    where = subprocess.run(
        [str(python), "-c", "import brim.proxy.app; print(brim.proxy.app.__file__)"],
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(site), where.stdout + where.stderr  # the wheel's code ran
