"""The test suite as a regular package, so that `tests.*` imports resolve to this folder even where
another distribution installs a top-level `tests` package (a namespace package loses to it).
"""
