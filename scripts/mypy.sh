#!/usr/bin/env bash
# Type-checks smalti with mypy (configured in pyproject.toml), from .venv or $VENV.
# mypy cannot follow the editable install's import hook, and the package's
# layout is not its folders' (core/ is `smalti`, hopper/ is `smalti.hopper`:
# package-dir in pyproject.toml). So this lays that layout out as symlinks
# under build/typecheck (mypy_path), anew each run so that new files are seen,
# and runs mypy on it; its messages name files as build/typecheck/smalti/...
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
"$venv/bin/python" - <<'PY'
import os
import pathlib
import shutil
import tomllib

with open("pyproject.toml", "rb") as f:
    package_dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
tree = pathlib.Path("build/typecheck")
shutil.rmtree(tree, ignore_errors=True)
for package, source in sorted(package_dirs.items()):  # a package before its subpackages
    target = tree.joinpath(*package.split("."))
    target.mkdir(parents=True, exist_ok=True)
    for entry in pathlib.Path(source).iterdir():
        link = target / entry.name
        if entry.name != "__pycache__" and not link.exists():
            link.symlink_to(os.path.relpath(entry.resolve(), target.resolve()))
PY
exec "$venv/bin/mypy" "$@"
