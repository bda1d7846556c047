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
    # one interpreter per module, all in one subprocess run to keep it quick
    script = ("import subprocess, sys\n"
              "bad = []\n"
              "for n in sys.argv[1:]:\n"
              "    r = subprocess.run([sys.executable, '-c', 'import ' + n], capture_output=True, text=True)\n"
              "    if r.returncode:\n"
              "        bad.append(n + ': ' + r.stderr.strip().splitlines()[-1])\n"
              "print('\\n'.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, cwd=ROOT,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", out.stdout
