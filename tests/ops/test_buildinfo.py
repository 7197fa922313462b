"""The record a binary of the kernels carries, and the loader's choice made from it.

A binary is loaded only if it was built from these sources, for the torch now loaded and for an
instruction set this processor has; otherwise a source tree compiles, and an installed package
runs the PyTorch loop, saying so in one line at import with how to get the kernels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from linattn.ops import _buildinfo, _native

needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)


def fake_binary(path: Path, info: dict[str, str]) -> Path:
    """A file with ``info`` recorded as a build records it (the C string, amid other bytes)."""
    text = ";".join(f"{k}={v}" for k, v in info.items())
    path.write_bytes(b"\x7fELF junk\0" + _buildinfo.MARKER + text.encode() + b"\0more junk")
    return path


def here(**change: str) -> dict[str, str]:
    """The info of a build made here and now, with ``change``."""
    return {**_buildinfo.build_info(torch.__version__), **change}


def test_the_record_is_c_source_and_is_read_back(tmp_path):
    info = here()
    source = _buildinfo.info_source(info)
    assert 'extern "C" __attribute__((used, visibility("default")))' in source
    text = source.split('"LINATTN-BUILD-INFO:', 1)[1].split('"', 1)[0]
    assert dict(item.split("=", 1) for item in text.split(";")) == info
    assert _buildinfo.read_info(fake_binary(tmp_path / "b.so", info)) == info
    assert _buildinfo.read_info(tmp_path / "missing.so") is None
    (tmp_path / "empty.so").touch()
    assert _buildinfo.read_info(tmp_path / "empty.so") is None
    with pytest.raises(ValueError, match="cannot be put in a C string"):
        _buildinfo.info_source({"torch": 'a"b'})


def test_a_binary_fits_only_its_sources_torch_and_processor(monkeypatch):
    version = torch.__version__
    assert _buildinfo.misfit(here(), version) is None
    assert _buildinfo.misfit(None, version) == "it records no build info"
    why = _buildinfo.misfit(here(torch="2.12.0+cpu"), version)
    assert why == f"it was built for torch 2.12.0+cpu, and torch {version} is loaded"
    why = _buildinfo.misfit(here(source="0" * 16), version)
    assert why == "it was built from other sources than these (csrc/ changed since)"
    why = _buildinfo.misfit(here(cpu="0" * 16), version)
    assert why == "it was built with -march=native on another processor"
    portable = {k: v for k, v in here(arch="x86-64-v3").items() if k != "cpu"}
    monkeypatch.setattr(_buildinfo, "cpu_flags", lambda: _buildinfo.LEVEL_FLAGS["x86-64-v3"])
    assert _buildinfo.misfit(portable, version) is None
    monkeypatch.setattr(_buildinfo, "cpu_flags", lambda: _buildinfo.LEVEL_FLAGS["x86-64-v2"])
    why = _buildinfo.misfit(portable, version)
    assert why.startswith("it was built for x86-64-v3, and this processor lacks avx, avx2, ")


@pytest.mark.parametrize("value", ["x86-64-v3", "native", "", "skylake"])
def test_the_arch_comes_from_the_environment(value, monkeypatch):
    monkeypatch.setenv("LINATTN_ARCH", value)
    assert _buildinfo.arch_from_environment() == (value or "native")
    assert f"-march={value or 'native'}" in _buildinfo.flags(_buildinfo.arch_from_environment())


def test_a_bad_arch_is_named(monkeypatch):
    monkeypatch.setenv("LINATTN_ARCH", "native; rm")
    with pytest.raises(ValueError, match="LINATTN_ARCH must be a -march value"):
        _buildinfo.arch_from_environment()


def test_the_plan_follows_the_installed_binary(tmp_path, monkeypatch, capsys):
    other = fake_binary(tmp_path / "other.so", here(torch="2.12.0+cpu"))
    monkeypatch.setattr(_native, "installed_binary", lambda: other)
    monkeypatch.setattr(_native, "compiler", lambda: "/usr/bin/c++")
    monkeypatch.setattr(_native, "source_tree", lambda: True)
    how, path, why = _native.plan()
    assert (how, path) == ("compile", None)
    assert why == (
        "the installed binary does not fit: it was built for torch 2.12.0+cpu, and torch "
        f"{torch.__version__} is loaded"
    )
    monkeypatch.setattr(_native, "source_tree", lambda: False)  # an installed package
    assert _native.plan()[0] == "loop"
    fits = fake_binary(tmp_path / "fits.so", here())
    monkeypatch.setattr(_native, "installed_binary", lambda: fits)
    assert _native.plan() == ("installed", fits, "")
    # No binary and no compiler: one line at import, saying what runs and how to get the kernels.
    monkeypatch.setattr(_native, "installed_binary", lambda: None)
    monkeypatch.setattr(_native, "compiler", lambda: None)
    monkeypatch.delenv("LINATTN_NATIVE", raising=False)
    _native.announce()
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        "linattn: the fused CPU kernels are unavailable (no binary was built with this "
        "package, and no C++ compiler is found to build them): the PyTorch loop runs; to get "
        "them, where a C++ compiler is found, run `linattn build` or reinstall linattn (pip "
        "install --no-build-isolation --force-reinstall --no-deps"
    )
    monkeypatch.setenv("LINATTN_NATIVE", "0")  # chosen: nothing said
    _native.announce()
    assert capsys.readouterr().err == ""


def test_an_installed_package_without_a_binary_runs_the_loop(monkeypatch):
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setattr(_native, "installed_binary", lambda: None)
    monkeypatch.setattr(_native, "source_tree", lambda: False)
    monkeypatch.delenv("LINATTN_NATIVE", raising=False)
    assert not _native.available()
    assert _native.reason().startswith("unavailable: no binary was built with this package")


@needs_native
def test_the_loaded_binary_is_the_installed_one_where_it_fits():
    installed = _native.installed_binary()
    if installed is None or _native.plan()[0] != "installed":
        pytest.skip(f"no fitting installed binary here ({_native.plan()[2]})")
    assert _native.location() == installed
    assert _native.reason().startswith(f"installed, built for torch {torch.__version__} with ")
