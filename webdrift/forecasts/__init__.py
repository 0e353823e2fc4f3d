"""Trained DS2D forecast files shipped with webdrift (package data; docs/FORECAST.md): use one
with `speculative="forecast:PATH"`. Made by `webdrift train-forecast` (webdrift/tools/forecast.py).
"""
