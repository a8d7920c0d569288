"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and they catch an upward
import: the layering cannot rot silently."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = shutil.which("lint-imports", path=sysconfig.get_path("scripts")) or shutil.which("lint-imports")

pytestmark = pytest.mark.skipif(LINT_IMPORTS is None, reason="import-linter is not installed (pip install -e '.[dev]')")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    assert LINT_IMPORTS is not None
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy(tmp_path: Path) -> Path:
    for name in ("fuzz", "strategies"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_contracts_hold() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        # the model reaching up into the driver (and through it, torch)
        ("fuzz/model/tree.py", "import fuzz.cli", "Driver layers"),
        # a strategy reaching a judge, as strategies once did for known-bug conditions
        ("strategies/_cases.py", "import fuzz.properties.parity", "Driver layers"),
        # a judge reaching the process pool for its verdict types
        ("fuzz/known.py", "import fuzz.pool", "Driver layers"),
        # the rank side reaching the driver
        ("fuzz/_rank/models.py", "import fuzz.properties", "rank side"),
    ],
)
def test_a_planted_upward_import_breaks_a_contract(tmp_path: Path, module: str, planted: str, broken: str) -> None:
    root = _copy(tmp_path)
    target = root / module
    target.write_text(target.read_text() + f"\n{planted}  # planted by the test\n")
    result = _lint(root)
    assert result.returncode != 0, result.stdout
    assert f"{broken}" in result.stdout and "BROKEN" in result.stdout, result.stdout
    assert module.removesuffix(".py").replace("/", ".") in result.stdout


def test_the_copy_used_by_the_planted_tests_is_the_one_linted(tmp_path: Path) -> None:
    """Without a plant, the copy passes: a failure above comes from the plant, not the copy."""
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
