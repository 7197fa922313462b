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


def test_human_bytes():
    from linattn.experiments._args import human_bytes

    assert [human_bytes(n) for n in (0, 1023, 1536, 3 * 2**30, 2.5e12)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "3 GiB",
        "2.27 TiB",
    ]
    assert human_bytes(1e40) == "8.27e+15 YiB"  # past the last unit: still one number


def test_check_memory_refuses_what_the_machine_cannot_hold():
    from linattn.experiments._args import check_memory, machine_memory

    assert machine_memory() > 0  # Linux says
    check_memory("--T 8", 2**20, memory=2**30)  # fits: nothing
    check_memory("--T 8", 2**40, memory=0)  # the machine's memory unknown: nothing refused
    with pytest.raises(ValueError) as error:
        check_memory("--T 10000000000 --K 16", 1.6e21, memory=16 * 2**30)
    assert str(error.value) == (
        "--T 10000000000 --K 16 would take at least 1.36 ZiB of memory; this machine has 16 GiB"
    )


def test_input_file_is_a_regular_file_of_bounded_size(tmp_path):
    from linattn.experiments._args import input_file

    good = tmp_path / "bench.json"
    good.write_text("{}")
    assert input_file("--bench", str(good)) == good
    with pytest.raises(ValueError, match=r"^--bench .*nope\.json: No such file or directory$"):
        input_file("--bench", tmp_path / "nope.json")
    with pytest.raises(ValueError, match=r"^--bench .* is not a regular file$"):
        input_file("--bench", tmp_path)  # a folder
    with pytest.raises(ValueError, match=r"^--bench /dev/zero is not a regular file$"):
        input_file("--bench", "/dev/zero")
    with pytest.raises(ValueError, match=r"is 2 B, more than the 1 B an input file may be$"):
        input_file("--bench", good, limit=1)
