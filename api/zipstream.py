"""A ZIP archive laid out up front, so any byte range of it can be produced on demand without building it.

GET /batches/{id}/archive serves the finished MP4s of a batch as one zip, streamed and resumable with Range. The
standard library's `zipfile` writes an archive front to back into a file object; it cannot say how long the archive
will be before writing it, nor produce bytes 3,000,000..3,999,999 of it without writing everything before. Here
every member is STORED (MP4 is already compressed) with its size and CRC-32 known before its header is written, so
the offset of every header, every data byte and the central directory follows from the sizes alone: the archive's
length and ETag are known at once, and a range is served by reading only the members it covers. Names are UTF-8
(flag bit 11); ZIP64 records (APPNOTE 4.5.3, 4.3.14-15) are written where a size, offset or count needs them, so an
archive past 4 GiB stays readable. CRCs may be supplied or computed lazily, the first time a header that needs one
is produced (`crc_of`), which lets the caller cache them.
"""
from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

CHUNK = 1 << 20
_LIMIT = 0xFFFFFFFF
_LOCAL = struct.Struct("<4s2B4HL2L2H")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_END = struct.Struct("<4s4H2LH")
_END64 = struct.Struct("<4sQ2H2L4Q")
_LOCATOR = struct.Struct("<4sLQL")
_UTF8 = 0x0800
_VERSION, _VERSION64 = 20, 45
_UNIX = 3
_FILE_MODE = 0o100644 << 16


@dataclass(frozen=True)
class Member:
    """One archive member: bytes in memory (`data`) or a file `open()` returns (read from the start, `size` long)."""

    name: str
    size: int
    open: Callable[[], BinaryIO] | None = None
    data: bytes | None = None
    crc32: int | None = None


def file_crc32(stream: BinaryIO) -> int:
    """CRC-32 of a stream read to its end."""
    crc = 0
    for chunk in iter(lambda: stream.read(CHUNK), b""):
        crc = zlib.crc32(chunk, crc)
    return crc


def dos_stamp(unix_time: float) -> tuple[int, int]:
    """(time, date) in MS-DOS form, from the UTC clock (so the layout does not depend on the server's zone)."""
    t = time.gmtime(max(unix_time, 315532800))  # 1980-01-01: the earliest a DOS date can say
    dos_time = (t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec // 2)
    return dos_time, ((t.tm_year - 1980) << 9) | (t.tm_mon << 5) | t.tm_mday


class ZipLayout:
    """Where every byte of the archive comes from. `length` is the archive's size; `iter_range(start, stop)`
    yields bytes start..stop-1. `crc_of(member)` computes a CRC not given on the member (default: read it)."""

    def __init__(self, members: list[Member], *, modified: float = 0.0,
                 crc_of: Callable[[Member], int] | None = None, force_zip64: bool = False):
        self.members = members
        self.dos_time, self.dos_date = dos_stamp(modified)
        self._crc_of = crc_of or _read_crc
        self._crcs: dict[int, int] = {}
        self.force_zip64 = force_zip64
        self._names = [m.name.encode("utf-8") for m in members]
        self.offsets: list[int] = []
        position = 0
        for member, name in zip(members, self._names):
            self.offsets.append(position)
            position += _LOCAL.size + len(name) + len(self._local_extra(member)) + member.size
        self.cd_offset = position
        self.cd_size = sum(_CENTRAL.size + len(name) + len(self._central_extra(i)) for i, name in
                           enumerate(self._names))
        self.zip64_end = (force_zip64 or len(members) >= 0xFFFF or self.cd_offset >= _LIMIT
                          or self.cd_size >= _LIMIT)
        tail = (_END64.size + _LOCATOR.size if self.zip64_end else 0) + _END.size
        self.length = self.cd_offset + self.cd_size + tail
        # (start, length, kind, member index): the archive as consecutive segments
        self._segments: list[tuple[int, int, str, int]] = []
        for i, member in enumerate(members):
            header = _LOCAL.size + len(self._names[i]) + len(self._local_extra(member))
            self._segments.append((self.offsets[i], header, "local", i))
            self._segments.append((self.offsets[i] + header, member.size, "data", i))
        self._segments.append((self.cd_offset, self.length - self.cd_offset, "directory", -1))

    # --- records ---

    def crc(self, i: int) -> int:
        if i not in self._crcs:
            member = self.members[i]
            if member.crc32 is not None:
                self._crcs[i] = member.crc32
            elif member.data is not None:
                self._crcs[i] = zlib.crc32(member.data)
            else:
                self._crcs[i] = self._crc_of(member)
        return self._crcs[i]

    def _local_zip64(self, member: Member) -> bool:
        return self.force_zip64 or member.size >= _LIMIT

    def _local_extra(self, member: Member) -> bytes:
        return struct.pack("<2H2Q", 1, 16, member.size, member.size) if self._local_zip64(member) else b""

    def _central_extra(self, i: int) -> bytes:
        fields = []
        if self.force_zip64 or self.members[i].size >= _LIMIT:
            fields += [self.members[i].size, self.members[i].size]
        if self.force_zip64 or self.offsets[i] >= _LIMIT:
            fields.append(self.offsets[i])
        return struct.pack(f"<2H{len(fields)}Q", 1, 8 * len(fields), *fields) if fields else b""

    def local_header(self, i: int) -> bytes:
        member, name = self.members[i], self._names[i]
        extra = self._local_extra(member)
        size = _LIMIT if extra else member.size
        return _LOCAL.pack(b"PK\x03\x04", _VERSION64 if extra else _VERSION, 0, _UTF8, 0, self.dos_time,
                           self.dos_date, self.crc(i), size, size, len(name), len(extra)) + name + extra

    def directory(self) -> bytes:
        """The central directory and the end records."""
        parts = []
        for i, (member, name) in enumerate(zip(self.members, self._names)):
            extra = self._central_extra(i)
            big_size = self.force_zip64 or member.size >= _LIMIT
            big_offset = self.force_zip64 or self.offsets[i] >= _LIMIT
            size = _LIMIT if big_size else member.size
            version = _VERSION64 if extra else _VERSION
            parts.append(_CENTRAL.pack(b"PK\x01\x02", version, _UNIX, version, 0, _UTF8, 0, self.dos_time,
                                       self.dos_date, self.crc(i), size, size, len(name), len(extra), 0, 0, 0,
                                       _FILE_MODE, _LIMIT if big_offset else self.offsets[i]) + name + extra)
        count = len(self.members)
        if self.zip64_end:
            end64_offset = self.cd_offset + self.cd_size
            parts.append(_END64.pack(b"PK\x06\x06", _END64.size - 12, _VERSION64, _VERSION64, 0, 0, count, count,
                                     self.cd_size, self.cd_offset))
            parts.append(_LOCATOR.pack(b"PK\x06\x07", 0, end64_offset, 1))
            parts.append(_END.pack(b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, _LIMIT, _LIMIT, 0))
        else:
            parts.append(_END.pack(b"PK\x05\x06", 0, 0, count, count, self.cd_size, self.cd_offset, 0))
        return b"".join(parts)

    # --- bytes ---

    def iter_range(self, start: int = 0, stop: int | None = None) -> Iterator[bytes]:
        """Bytes start..stop-1 of the archive (stop defaults to its end), in chunks of at most CHUNK."""
        stop = self.length if stop is None else min(stop, self.length)
        for seg_start, seg_len, kind, i in self._segments:
            seg_end = seg_start + seg_len
            if seg_end <= start or seg_start >= stop or seg_len == 0:
                continue
            lo, hi = max(start, seg_start) - seg_start, min(stop, seg_end) - seg_start
            if kind == "local":
                yield self.local_header(i)[lo:hi]
            elif kind == "directory":
                yield self.directory()[lo:hi]
            elif self.members[i].data is not None:
                yield self.members[i].data[lo:hi]
            else:
                yield from _file_slice(self.members[i], lo, hi)


def _read_crc(member: Member) -> int:
    assert member.open is not None
    with member.open() as stream:
        return file_crc32(stream)


def _file_slice(member: Member, lo: int, hi: int) -> Iterator[bytes]:
    assert member.open is not None
    with member.open() as stream:
        stream.seek(lo)
        left = hi - lo
        while left > 0:
            chunk = stream.read(min(CHUNK, left))
            if not chunk:
                raise OSError(f"{member.name}: the file ended {left} bytes early (changed while being served)")
            left -= len(chunk)
            yield chunk
