#!/usr/bin/env bash
# Install the third-party model zoo used by tests/zoo (pins: requirements-zoo.txt). Idempotent: pip skips what is
# already installed at the pinned version. Everything goes in with --no-deps so torch/numpy of the main stack stay.
#   usage: scripts/install_zoo.sh [VENV]      (default: .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PY="$VENV/bin/python"
test -x "$PY" || { echo "install_zoo.sh: $PY not found (run make install first)" >&2; exit 2; }

"$PY" -m pip install -q --disable-pip-version-check --no-deps -r requirements-zoo.txt

"$PY" - <<'PY'
import numpy, torch
assert torch.__version__.split("+")[0] == "2.13.0", f"torch changed: {torch.__version__}"
assert numpy.__version__ < "2", f"numpy changed: {numpy.__version__}"
import sys
sys.path.insert(0, ".")
import tests.zoo.torch_compat  # noqa: F401  (torchvision schemas before timm/transformers)
import mindcv, mindone, timm, transformers  # noqa: F401,E401
print(f"zoo ok: torch {torch.__version__}, numpy {numpy.__version__}, timm {timm.__version__}, "
      f"transformers {transformers.__version__}, mindcv 0.3.0, mindone 0.5.0")
PY
