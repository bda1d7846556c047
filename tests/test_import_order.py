"""Every product module imports on its own, first in a fresh interpreter: an import cycle that
only bites in one import order (``epp_client.config`` first broke on ``uncached_prompt_tokens``)
fails here rather than in a user's program."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import epp_client

ROOT = Path(__file__).resolve().parent.parent


def test_each_epp_client_module_imports_first_on_its_own():
    names = sorted(m.name for m in pkgutil.walk_packages(epp_client.__path__, "epp_client."))
    assert "epp_client.config" in names and "epp_client.twin" in names
    # One fresh interpreter forks a child per module: the child imports that module first of the
    # project's modules. The interpreter loads the heavy third-party libraries once before forking
    # (they are no part of an import cycle of ours), so each child costs little.
    script = ("import os, sys\n"
              "import numpy, httpx, yaml, orjson\n"
              "ours = {'epp_client', 'features', 'load', 'gateway', 'training_server', 'prediction_server'}\n"
              "assert not [m for m in sys.modules if m.split('.')[0] in ours], 'a project module is loaded'\n"
              "bad = []\n"
              "for n in sys.argv[1:]:\n"
              "    r, w = os.pipe()\n"
              "    pid = os.fork()\n"
              "    if pid == 0:\n"
              "        os.close(r)\n"
              "        try:\n"
              "            __import__(n)\n"
              "        except BaseException as e:\n"
              "            os.write(w, f'{type(e).__name__}: {e}'.encode()[:4000])\n"
              "            os._exit(1)\n"
              "        os._exit(0)\n"
              "    os.close(w)\n"
              "    with os.fdopen(r, 'rb') as f:\n"
              "        msg = f.read().decode()\n"
              "    if os.waitpid(pid, 0)[1]:\n"
              "        bad.append(n + ': ' + msg)\n"
              "print('\\n'.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, cwd=ROOT,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", out.stdout
