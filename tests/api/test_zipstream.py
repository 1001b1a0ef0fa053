"""api/zipstream.py: the archive laid out up front reads back with the standard library's zipfile (plain and ZIP64),
any set of byte ranges reassembles to the whole, and CRCs are computed once, only when a header needs them."""
from __future__ import annotations

import io
import os
import zipfile

import pytest

from h3batch.api.zipstream import Member, ZipLayout


@pytest.fixture
def files(tmp_path):
    paths = []
    for i, size in enumerate((0, 1, 70_001, 2_500_000)):
        path = tmp_path / f"f{i}.bin"
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths


def _members(files):
    return [Member("manifest.jsonl", 12, data=b'{"index":0}\n')] + [
        Member(f"clip-é{i}.mp4", p.stat().st_size, open=(lambda p=p: p.open("rb"))) for i, p in enumerate(files)]


@pytest.mark.parametrize("force_zip64", [False, True])
def test_layout_reads_back_with_zipfile_and_ranges_reassemble(files, force_zip64):
    layout = ZipLayout(_members(files), modified=1_764_571_200, force_zip64=force_zip64)
    whole = b"".join(layout.iter_range())
    assert len(whole) == layout.length
    with zipfile.ZipFile(io.BytesIO(whole)) as zf:
        assert zf.testzip() is None  # every CRC checks
        assert zf.namelist() == ["manifest.jsonl"] + [f"clip-é{i}.mp4" for i in range(len(files))]
        for i, path in enumerate(files):
            assert zf.read(f"clip-é{i}.mp4") == path.read_bytes()
            info = zf.getinfo(f"clip-é{i}.mp4")
            assert info.compress_type == zipfile.ZIP_STORED and info.date_time == (2025, 12, 1, 6, 40, 0)
    for step in (997, 65_536, layout.length):
        assert b"".join(b"".join(layout.iter_range(s, s + step)) for s in range(0, layout.length, step)) == whole
    cut = [0, 5, 29, 30, 31, layout.cd_offset - 1, layout.cd_offset, layout.length - 22, layout.length]
    pieces = [b"".join(layout.iter_range(a, b)) for a, b in zip(cut, cut[1:])]
    assert b"".join(pieces) == whole


def test_crcs_are_computed_lazily_once_and_the_layout_is_deterministic(files):
    computed: list[str] = []

    def crc_of(member):
        computed.append(member.name)
        import zlib  # noqa: PLC0415
        with member.open() as f:
            return zlib.crc32(f.read())

    layout = ZipLayout(_members(files), modified=0, crc_of=crc_of)
    head = b"".join(layout.iter_range(0, 40))  # the manifest's header only: no file read
    assert computed == [] and head[:4] == b"PK\x03\x04"
    first = b"".join(layout.iter_range())
    assert sorted(computed) == sorted(f"clip-é{i}.mp4" for i in range(len(files)))  # each once
    again = ZipLayout(_members(files), modified=0)
    assert b"".join(again.iter_range()) == first
