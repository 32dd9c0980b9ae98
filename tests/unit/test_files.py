"""parallel.core.files.read_bounded: the one reader of small user-named files, on the real file system."""

from __future__ import annotations

import os

import pytest

from parallel.core.files import NotARegularFile, TooLarge, read_bounded


def test_reads_a_file_up_to_its_limit_and_refuses_one_byte_more(tmp_path):
    f = tmp_path / "fit.json"
    f.write_bytes(b"x" * 10)
    assert read_bounded(f, 10) == b"x" * 10
    with pytest.raises(TooLarge) as err:
        read_bounded(f, 9)
    assert err.value.limit == 9 and "larger than 9 bytes" in str(err.value)


def test_a_fifo_or_a_folder_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    for path in (fifo, tmp_path):
        with pytest.raises(NotARegularFile, match="not a regular file"):
            read_bounded(path, 100)


def test_a_missing_file_is_the_os_error():
    with pytest.raises(FileNotFoundError):
        read_bounded("/nonexistent/calibration.json", 100)
