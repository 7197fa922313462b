"""The nine figures, drawn once for every test of tests/figures (about 15 s)."""

import pytest

from linattn.figures import render_figures, style


@pytest.fixture(scope="session")
def rendered(tmp_path_factory):
    """(directory, paths) of the nine figures; the SVG text kept as text, for reading numbers."""
    out = tmp_path_factory.mktemp("figures")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(style, "SVG_FONTTYPE", "none")
        return out, render_figures(out)
