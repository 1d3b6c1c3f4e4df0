"""The allocator tunables: set on glibc, a no-op elsewhere, and freed memory stays mapped."""

from __future__ import annotations

import platform
import resource

import pytest

from jigsawrl.engine import allocator
from jigsawrl.engine.allocator import keep_freed_memory

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="glibc's malloc tunables only")


def _faults_touching(size: int) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buf = bytearray(size)  # malloc'd and zero-filled: every page touched
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    del buf
    return after - before


@glibc
def test_freed_memory_is_reused_without_page_faults() -> None:
    assert keep_freed_memory()
    size = 24 << 20  # under the 32 MiB mmap threshold: from the heap, kept after free
    _faults_touching(size)  # grows the heap (faults) once
    pages = size // resource.getpagesize()
    assert _faults_touching(size) < pages // 10  # the second time the pages are still mapped


def test_not_glibc_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    called: list[object] = []
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda *a: called.append(a))
    assert keep_freed_memory() is False
    assert called == []


@glibc
def test_a_refused_setting_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    class Libc:
        @staticmethod
        def mallopt(param: int, value: int) -> int:
            return 0  # glibc's answer to a value it does not take

    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda *a: Libc())
    assert keep_freed_memory() is False
