"""Helpers shared by the tests (importable as ``support``: pytest puts ``tests/`` on the path)."""
