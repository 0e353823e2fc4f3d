"""The WGSL template renderer (webdrift/kernels/template.py): substitutions, #if / #elif / #else,
and #repeat blocks (the K-column GEMVs' per-column statements), with the errors a broken
template gets."""

from __future__ import annotations

import pytest

from webdrift.errors import GPUError
from webdrift.kernels.template import render


def test_substitution_and_conditions():
    text = "a {{X}}\n#if F\nf\n#elif G\ng\n#else\nh\n#endif\n#if !F\nnot f\n#endif\n"
    assert render(text, {"X": 3, "F": False, "G": True}) == "a 3\ng\nnot f\n"
    assert render(text, {"X": "y", "F": True, "G": True}) == "a y\nf\n"


def test_repeat_copies_with_their_index():
    text = "start\n#repeat N\n  var a{{#}} = {{V}};\n#if F\n  f{{#}}();\n#endif\n#endrepeat\nend\n"
    assert render(text, {"N": 3, "V": 1.5, "F": True}) == (
        "start\n  var a0 = 1.5;\n  f0();\n  var a1 = 1.5;\n  f1();\n  var a2 = 1.5;\n  f2();\nend\n")
    assert render(text, {"N": 1, "V": 0, "F": False}) == "start\n  var a0 = 0;\nend\n"
    assert render(text, {"N": 0, "V": 0, "F": False}) == "start\nend\n"


@pytest.mark.parametrize("text,message", [
    ("#repeat N\n#repeat N\nx\n#endrepeat\n#endrepeat\n", "do not nest"),
    ("#repeat N\nx\n", "unclosed #repeat"),
    ("x\n#endrepeat\n", "without #repeat"),
    ("#repeat M\nx\n#endrepeat\n", "repeats M times but it was not defined"),
    ("#if N\nx\n", "unbalanced #if"),
    ("{{Y}}\n", "needs {{Y}}"),
])
def test_broken_templates(text, message):
    with pytest.raises(GPUError, match=message):
        render(text, {"N": 2})
