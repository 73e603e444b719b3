#!/usr/bin/env bash
# The two commands a new user needs:
#   ./dev.sh serve [brim serve options]   set up (first run only) and start brim on 127.0.0.1:8787
#   ./dev.sh test  [pytest options]       set up (first run only) and run the test suite
# Setup: a virtualenv in .venv (or $BRIM_VENV) with brim installed editable plus its test extras,
# redone whenever pyproject.toml changes. Needs Python 3.11+ ($PYTHON picks the interpreter).
set -euo pipefail
cd "$(dirname "$0")"

venv="${BRIM_VENV:-.venv}"
python="${PYTHON:-python3}"

setup() {
  if [ -x "$venv/bin/brim" ] && [ "$venv/.installed" -nt pyproject.toml ]; then
    return
  fi
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "dev.sh: brim needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
    exit 1
  fi
  echo "dev.sh: setting up $venv (first run, or pyproject.toml changed)..." >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test]'
  touch "$venv/.installed"
}

command="${1:-}"
[ $# -gt 0 ] && shift
case "$command" in
  serve)
    setup
    exec "$venv/bin/brim" serve "$@"
    ;;
  test)
    setup
    export LITELLM_LOCAL_MODEL_COST_MAP=True
    # Two worker processes (pytest-xdist; BRIM_TEST_WORKERS to change, 0 for one process): the
    # suite waits on sockets and subprocesses most of the time, so two halve it on two cores.
    exec "$venv/bin/python" -m pytest -n "${BRIM_TEST_WORKERS:-2}" "$@"
    ;;
  *)
    sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
