"""The one input layer (pcc.lang.inputs): regular files only, read once, bounded; strict JSON."""

from __future__ import annotations

import os
import time

import pytest

from pcc.lang.diagnostics import DiagnosticError
from pcc.lang.inputs import DuplicateKey, InputError, loads_json, read_bytes, read_json
from pcc.lang.inputs import MAX_CONTRACT
from pcc.lang.parser import read_source


def test_a_link_to_dev_zero_is_refused_before_a_byte_is_read(tmp_path):
    link = tmp_path / "zero.prec"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="character device, not a regular file") as err:
        read_bytes(link, 1 << 30)
    assert err.value.reason == "kind" and err.value.code == "PCC109"
    with pytest.raises(DiagnosticError) as err:
        read_source(str(link))
    assert [d.code for d in err.value.diagnostics] == ["PCC109"]


def test_a_fifo_without_a_writer_does_not_hang(tmp_path):
    fifo = tmp_path / "c.prec"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(InputError, match="a FIFO"):
        read_bytes(fifo, MAX_CONTRACT)
    assert time.monotonic() - t0 < 5


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(InputError, match="a directory"):
        read_bytes(tmp_path, MAX_CONTRACT)


def test_a_huge_sparse_file_is_refused_on_its_size_without_reading_it(tmp_path):
    big = tmp_path / "big.prec"
    with open(big, "wb") as fh:
        fh.truncate(800 << 20)  # 800 MB that take no disk
    t0 = time.monotonic()
    with pytest.raises(DiagnosticError) as err:
        read_source(str(big))
    assert time.monotonic() - t0 < 1
    assert [d.code for d in err.value.diagnostics] == ["PCC104"]
    assert "larger than 1024 KiB" in err.value.diagnostics[0].message


def test_the_limit_holds_on_the_bytes_read(tmp_path):
    f = tmp_path / "f.json"
    f.write_bytes(b"x" * 101)
    with pytest.raises(InputError, match="over the 0 KiB limit") as err:
        read_bytes(f, 100)
    assert err.value.reason == "size"
    assert read_bytes(f, 101) == b"x" * 101


def test_an_unreadable_file_names_itself(tmp_path):
    with pytest.raises(InputError, match=r"missing\.json: cannot read: No such file"):
        read_json(tmp_path / "missing.json")


def test_json_refuses_duplicate_keys_and_non_finite_numbers(tmp_path):
    with pytest.raises(DuplicateKey, match="duplicate key 'a'"):
        loads_json('{"a": 1, "b": {"c": 2}, "a": 3}')
    for text in ('{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}'):
        with pytest.raises(ValueError, match="finite"):
            loads_json(text)
    assert loads_json('{"a": {"a": 1}}') == {"a": {"a": 1}}  # one key per mapping, not per document
    f = tmp_path / "m.json"
    f.write_text('{"a": 1, "a": 2}')
    with pytest.raises(InputError, match=r"m\.json: not valid JSON \(duplicate key 'a'\)"):
        read_json(f)
    f.write_text("[" * 100000)
    with pytest.raises(InputError, match="not valid JSON"):
        read_json(f)
