#!/usr/bin/env bash
# Creates .venv with a Python >= 3.12 (jax needs it) and installs smalti into
# it, editable, with jax 0.11.2 (JAX=0.12.0.1 for the other supported jax;
# VENV=path for another environment). `scripts/venv.sh test` also installs the test dependencies
# and the example third-party plugin (non-editable, so that it is found through
# its entry point like any plugin installed from an index).
set -euo pipefail
cd "$(dirname "$0")/.."

supported() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

python=""
for candidate in "${PYTHON:-}" python3.12 python3.13 python3.14 python3; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 && supported "$candidate"; then
    python="$candidate"; break
  fi
done
# pyenv installs interpreters that its shims hide unless selected: look there too.
if [ -z "$python" ] && command -v pyenv >/dev/null 2>&1; then
  for version in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9])' | sort -V); do
    candidate="$(pyenv root)/versions/$version/bin/python3"
    if supported "$candidate"; then python="$candidate"; break; fi
  done
fi
if [ -z "$python" ]; then
  echo "smalti needs Python >= 3.12 (for jax 0.11.2); none was found. Set PYTHON=/path/to/python3.12." >&2
  exit 1
fi

# VENV: where (default .venv); JAX: the jax and jaxlib version to install
# (default 0.11.2, smalti's first target; 0.12.0.1 is supported too).
venv="${VENV:-.venv}"
jax="${JAX:-0.11.2}"
if [ ! -x "$venv/bin/python" ] || ! supported "$venv/bin/python"; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
fi
extras=""
[ "${1:-}" = "test" ] && extras="[test]"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".${extras}" \
  "jax==$jax" "jaxlib==$jax"
if [ "${1:-}" = "test" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check ./examples/smalti-example-plugin
fi
