"""The package layers (pyproject.toml's import contracts) hold, and an import that climbs
back up a layer breaks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("forge_cli", "rl", "k8s_jobs", "mitm_addon", "pipeline")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=240,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)},
    )


def copy_tree(dest: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(
            ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_the_tree_keeps_every_import_contract() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout


def test_a_library_that_imports_the_cli_breaks_the_layers(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    tasks = tree / "k8s_jobs" / "tasks.py"
    tasks.write_text(tasks.read_text() + "\nfrom forge_cli.main import main  # noqa: E402\n")
    done = lint_imports(tree)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Contracts: 3 kept, 1 broken." in done.stdout
    assert "k8s_jobs.tasks -> forge_cli.main" in done.stdout


def test_pipeline_importing_mitmproxy_breaks_its_contract(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    schema = tree / "pipeline" / "schema.py"
    schema.write_text(schema.read_text() + "\nimport mitmproxy.http  # noqa: E402,F401\n")
    done = lint_imports(tree)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "pipeline (its schema above all) is importable without mitmproxy BROKEN" in done.stdout
    assert "pipeline.schema -> mitmproxy (l." in done.stdout
