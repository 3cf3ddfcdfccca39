"""smalti works installed normally (not only editable): the folder-to-package
mapping of pyproject.toml and the entry points are right in a built wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_normal_install_provides_every_package_and_plugin(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
         "--target", str(target), str(ROOT)],
        check=True, capture_output=True, text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    check = (
        "import smalti, smalti.plugins, smalti.hopper, smalti.blackwell, smalti.emulate.sync\n"
        f"assert smalti.__file__.startswith({str(target)!r}), smalti.__file__\n"
        "pipeline = smalti.build_pipeline()\n"
        "names = {p.name for p in pipeline.plugins}\n"
        "assert {'smalti.plugins', 'smalti.hopper', 'smalti.blackwell'} <= names, names\n"
        "from smalti import kernels\n"
        "kernel = kernels.example_kernel()\n"
        "smalti.infer_layouts(kernel.module, pipeline=pipeline)\n"
        "smalti.lower(kernel.module, kernel.launch_context, pipeline=pipeline)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def test_every_package_folder_is_listed_in_pyproject():
    """A subpackage missing from `packages` works editable and is absent from a wheel."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for package, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *relative.parts]))
    assert found <= listed, f"add to pyproject.toml's packages: {sorted(found - listed)}"
