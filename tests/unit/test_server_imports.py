"""A server replica's idle memory is the web stack's, not torch's: nothing the server imports
loads torch at import time (routes that never touch a tensor never need it).

``registry/__init__.py`` re-exports the torch-side API (its laziness is its own concern), so the
check imports ``server.app`` with the ``registry`` package's modules reachable but its
``__init__`` not run, and fails naming the module whose import loaded torch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import builtins, sys, traceback, types
package = types.ModuleType("registry")
package.__path__ = [sys.argv[1] + "/registry"]
sys.modules["registry"] = package
real_import = builtins.__import__
def watching(name, *args, **kwargs):
    if name.split(".")[0] == "torch" and "torch" not in sys.modules:
        frames = [f for f in traceback.extract_stack() if f.filename.startswith(sys.argv[1])]
        print("torch imported by " + " <- ".join(
            f"{f.filename[len(sys.argv[1]) + 1:]}:{f.lineno}" for f in reversed(frames)))
        raise SystemExit(1)
    return real_import(name, *args, **kwargs)
builtins.__import__ = watching
import server.app
"""


def test_the_server_imports_no_torch() -> None:
    result = subprocess.run([sys.executable, "-c", _PROBE, str(ROOT)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
