"""docs/client.md runs: each `python` block, in order, in one empty folder, against the live stack, with the API's
address and key in the environment as the page says; the files the examples write are real MP4s and a zip."""
from __future__ import annotations

import contextlib
import io
import re
import zipfile

import pytest

from h3batch.worker.h3.mp4 import probe_mp4
from tests.service_stack import REPO

PAGE = REPO / "docs" / "client.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)


def test_the_page_has_examples():
    """The page holds the examples this test runs (a page that lost its code blocks fails here, not silently)."""
    assert len(BLOCKS) >= 8


def test_every_example_runs_against_the_stack(api_env, tmp_path, monkeypatch):
    """Every block runs without an exception and prints what it says; the clips, the archive and the JSONL file
    it writes are on disk afterwards."""
    monkeypatch.chdir(tmp_path)
    outputs = []
    for number, code in enumerate(BLOCKS, 1):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            try:
                exec(compile(code, f"docs/client.md block {number}", "exec"), {"__name__": "__main__"})  # noqa: S102
            except Exception as exc:  # noqa: BLE001  (name the block that failed)
                pytest.fail(f"docs/client.md block {number} raised {type(exc).__name__}: {exc}\n{code}")
        outputs.append(printed.getvalue())
    for clip in ("rain.mp4", "kettle.mp4", "choir.mp4"):
        assert probe_mp4(tmp_path / clip)["frames"] > 0, clip
    with zipfile.ZipFile(tmp_path / "beach.zip") as zf:
        assert {"take-0.mp4", "take-1.mp4", "take-2.mp4"} <= set(zf.namelist())
    joined = "\n".join(outputs)
    assert "completed" in joined and "unsupported_size" in joined and "gone" in joined
    assert "[(2, 'seconds')]" in joined and "['completed', 'completed']" in joined
