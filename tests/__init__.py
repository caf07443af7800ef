"""Forge's tests (a package, so that `tests.*` resolves here and not to a dependency's
top-level `tests`: verl 0.9.1's wheel installs one into site-packages)."""
