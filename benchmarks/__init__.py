"""The project's benchmark and test tooling outside the importable library (not installed by setup.py)."""
