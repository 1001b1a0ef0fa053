"""core/archive_names.py: every batch item gets its own archive member, whatever the custom_ids (a Hypothesis
property over random custom_id sets); against the live stack the issue's three items (custom_id "0002-2", "0002" and
none) come back as three members named in the manifest's `file` column, and `h3batch submit --file` saves all three;
the CLI reports a completed item whose file an archive did not deliver (a zip holding one name twice, as the old rule
made) instead of ending as if every clip arrived."""
from __future__ import annotations

import io
import json
import re
import warnings
import zipfile

import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from h3batch.client import cli_batch as client_batch
from h3batch.core.archive_names import member_names
from h3batch.api.batch_service import CUSTOM_ID
from tests.api.conftest import auth
from tests.api.test_client_batch import CANVAS, prompts_file, run_cli
from tests.service_stack import wait_batch

ISSUE_ITEMS = [{"custom_id": "0002-2", "prompt": "a kettle", "seed": 1, **CANVAS},
               {"custom_id": "0002", "prompt": "a bell", "seed": 2, **CANVAS},
               {"prompt": "a drum", "seed": 3, **CANVAS}]

custom_ids = st.from_regex(CUSTOM_ID, fullmatch=True)
# Stems that collide on purpose: padded indexes, their `-<index>` forms, case twins.
colliding = st.sampled_from(["0000", "0001", "0002", "0002-2", "0003-1", "clip", "CLIP", "Clip", "0010", "00002"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12_000), st.one_of(st.none(), custom_ids, colliding)), max_size=60))
def test_member_names_are_unique_for_any_custom_ids(pairs):
    """Any items (unique indexes with gaps, unique custom_ids drawn from the accepted alphabet plus stems chosen to
    collide) get distinct names, also without case; a custom_id keeps `<custom_id>.mp4` unless an earlier custom_id
    took it without case; every name is a plain file name ending in .mp4."""
    items, seen_index, seen_id = [], set(), set()
    for index, custom_id in sorted(pairs, key=lambda pair: pair[0]):
        if index in seen_index or custom_id in seen_id:
            continue
        seen_index.add(index)
        if custom_id is not None:
            seen_id.add(custom_id)
        items.append((index, custom_id))
    names = member_names(items)
    assert sorted(names) == sorted(index for index, _ in items)
    assert len({name.casefold() for name in names.values()}) == len(items)
    claimed: set[str] = set()
    for index, custom_id in items:
        name = names[index]
        assert client_batch.safe_member(name) and name.endswith(".mp4") and name != "manifest.jsonl"
        if custom_id is not None:
            wanted = f"{custom_id}.mp4"
            assert name == (wanted if wanted.casefold() not in claimed else f"{custom_id}~{index}.mp4")
            claimed.add(wanted.casefold())


def test_the_issue_items_keep_three_distinct_names():
    """custom_id "0002-2", "0002" and none at index 2: the old rule gave `0002-2.mp4` twice."""
    assert member_names([(0, "0002-2"), (1, "0002"), (2, None)]) == {0: "0002-2.mp4", 1: "0002.mp4",
                                                                      2: "0002~2.mp4"}


def test_archive_and_cli_keep_all_three_clips(stack, tmp_path):
    """The issue's three items through the live stack: the zip holds three distinct MP4 members plus a manifest whose
    `file` column names each; `h3batch submit --file` saves all three and exits 0."""
    out_dir = tmp_path / "clips"
    done = run_cli("--file", str(prompts_file(tmp_path / "p.jsonl", ISSUE_ITEMS)), "--out-dir", str(out_dir),
                   "--api", stack.base, "--api-key", auth()["Authorization"].split()[1], "--no-progress")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out_dir.glob("*.mp4")) == ["0002-2.mp4", "0002.mp4", "0002~2.mp4"]
    batch_id = client_batch.load_state(out_dir)["batch_id"]
    wait_batch(stack.base, batch_id, auth())
    archive = requests.get(f"{stack.base}/batches/{batch_id}/archive", headers=auth(), timeout=60)
    assert archive.status_code == 200, archive.text
    with zipfile.ZipFile(io.BytesIO(archive.content)) as zf:
        names = zf.namelist()
        manifest = [json.loads(line) for line in zf.read("manifest.jsonl").splitlines()]
        assert all(zf.read(line["file"]) for line in manifest)
    assert names == ["manifest.jsonl", "0002-2.mp4", "0002.mp4", "0002~2.mp4"]
    assert [(m["custom_id"], m["file"]) for m in manifest] == [("0002-2", "0002-2.mp4"), ("0002", "0002.mp4"),
                                                                (None, "0002~2.mp4")]
    on_disk = [json.loads(line) for line in (out_dir / "manifest.jsonl").read_text().splitlines()]
    assert [m["file"] for m in on_disk] == [m["file"] for m in manifest]


def test_cli_names_every_completed_item_an_archive_did_not_deliver(tmp_path):
    """A zip written by the old naming rule (`0002-2.mp4` twice, the third item's name absent) is unzipped by the
    CLI's own `extract`; the check names the item whose file is missing, and the run would exit 1 for it."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    archive = tmp_path / "old.zip"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name: the point of this archive
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("manifest.jsonl", "{}\n")
            zf.writestr("0002-2.mp4", b"first")
            zf.writestr("0002.mp4", b"second")
            zf.writestr("0002-2.mp4", b"third")
    results = [{"index": 0, "custom_id": "0002-2", "status": "completed"},
               {"index": 1, "custom_id": "0002", "status": "completed"},
               {"index": 2, "custom_id": None, "status": "completed"}]
    state = {"batch_id": "batch_x", "files": {}}
    client_batch.save_state(out_dir, state)
    members = client_batch.extract(archive, out_dir, state)
    lines = client_batch.missing_files(results, members, out_dir, state)
    assert lines == ["item 0 [0002-2]: completed, but the archive holds 0002-2.mp4 more than once",
                     "item 2: completed, but 0002~2.mp4 is not in the archive"]
    assert all(re.match(r"^item \d+", line) for line in lines)
