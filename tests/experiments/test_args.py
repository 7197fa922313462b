"""The shared argparse types and output-path checks of the commands."""

from __future__ import annotations

import argparse

import pytest

from linattn.experiments import _args


def test_output_file_accepts_a_new_file_in_a_missing_folder_and_creates_nothing(tmp_path):
    path = tmp_path / "new" / "deeper" / "out.json"
    assert _args.output_file("--json", str(path)) == path
    assert list(tmp_path.iterdir()) == []  # the probe file is gone, no folder was made


def test_output_file_refuses_a_folder_and_a_path_below_a_file(tmp_path):
    with pytest.raises(ValueError, match=f"--plot {tmp_path} is a folder"):
        _args.output_file("--plot", tmp_path)
    parent = tmp_path / "f"
    parent.write_text("")
    with pytest.raises(ValueError, match=f"--plot {parent}/a/b.png: {parent} is a file"):
        _args.output_file("--plot", parent / "a" / "b.png")


def test_output_file_refuses_a_folder_that_takes_no_file():
    # /proc takes no new file, even for root (os.access would say yes to root)
    with pytest.raises(ValueError, match="--out /proc/x.json: cannot write in /proc"):
        _args.output_file("--out", "/proc/x.json")


def test_output_dir(tmp_path):
    assert _args.output_dir("--out", tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert _args.output_dir("--out", tmp_path) == tmp_path
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="--out .*/f is a file; expected a folder"):
        _args.output_dir("--out", tmp_path / "f")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


@pytest.mark.parametrize("text", ["kda,,softmax", "kda,", ",kda", "", " "])
def test_name_list_refuses_empty_items(text):
    with pytest.raises(argparse.ArgumentTypeError, match="separated by commas"):
        _args.name_list(("kda", "softmax"))(text)


def test_name_list():
    parse = _args.name_list(("kda", "softmax"))
    assert parse("kda, kda,softmax") == ("kda", "kda", "softmax")
    with pytest.raises(argparse.ArgumentTypeError, match=r"unknown names \['gru'\]"):
        parse("kda,gru")
