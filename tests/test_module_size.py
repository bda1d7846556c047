"""Every product module stays small enough to read in one sitting: at most 400 lines."""
from __future__ import annotations

from product_packages import REPO, product_packages

MAX_LINES = 400


def _lines(path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_product_module_exceeds_the_limit():
    modules = [p for pkg in product_packages() for p in sorted((REPO / pkg).rglob("*.py"))
               if "__pycache__" not in p.parts]
    assert len(modules) > 50, f"found only {len(modules)} product modules: is the package list right?"
    too_long = {str(p.relative_to(REPO)): n for p in modules if (n := _lines(p)) > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split them by job):\n" + "\n".join(
        f"  {name}: {n}" for name, n in sorted(too_long.items(), key=lambda kv: -kv[1]))
