"""Assembles webdrift's browser bundle (see build.py; `python -m build_wasm --out bundle/`)."""
