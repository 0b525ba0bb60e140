"""A benchmark study: see README.md in this folder."""
