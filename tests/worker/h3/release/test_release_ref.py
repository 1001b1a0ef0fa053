"""Release references (worker/h3/release_ref.py): the tiny release as a Hub repo in an offline cache, loaded by name."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
from huggingface_hub.utils import filter_repo_objects

from h3batch.core.startup_checks import check_release_dir
from h3batch.settings import Settings
from h3batch.worker.h3 import release_ref
from h3batch.worker.h3.contract import ContractError, validate_release
from h3batch.worker.h3.mp4 import probe_mp4
from h3batch.worker.h3.release_ref import ReleaseRef, ReleaseRefError, ReleaseRole, parse_release_ref, resolve_release
from h3batch.worker.h3.tiny_release import TINY_ENTRY, place_release_in_hub_cache, release_files

REPO_ID = TINY_ENTRY.model_id
PROMPT = "waves crash against black rocks"


@pytest.fixture(scope="module")
def hub(tiny, tmp_path_factory):
    """(cache, commit): a copy of the tiny hub cache that also holds the tiny release as repo REPO_ID at a commit."""
    cache = Path(shutil.copytree(tiny.hf_cache, tmp_path_factory.mktemp("hub") / "hf-cache", symlinks=True))
    commit, _ = place_release_in_hub_cache(tiny.release_dir, cache, REPO_ID)
    return cache, commit


def _frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


@pytest.mark.parametrize("text, expected", [
    ("org/name", ReleaseRef("org/name", repo_id="org/name", revision="main")),
    ("org/name@v1.2", ReleaseRef("org/name@v1.2", repo_id="org/name", revision="v1.2")),
    ("hf://org/name@" + "a" * 40, ReleaseRef("hf://org/name@" + "a" * 40, repo_id="org/name", revision="a" * 40)),
    ("hf://org/name", ReleaseRef("hf://org/name", repo_id="org/name", revision="main")),
    ("/models/release", ReleaseRef("/models/release", directory=Path("/models/release"))),
    ("./release", ReleaseRef("./release", directory=Path("./release"))),
    ("a/b/c", ReleaseRef("a/b/c", directory=Path("a/b/c"))),
])
def test_reference_forms(text, expected):
    """A directory, org/name, org/name@revision and hf://org/name@revision parse as documented."""
    assert parse_release_ref(text) == expected


def test_existing_directory_wins_over_the_hub_reading(tmp_path, monkeypatch):
    """`org/name` that exists as a directory is that directory; hf:// is always the Hub."""
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert parse_release_ref("org/name").directory == Path("org/name")
    assert parse_release_ref("hf://org/name").repo_id == "org/name"
    with pytest.raises(ReleaseRefError, match="hf://org/name@revision"):
        parse_release_ref("hf://just-a-name")


def test_settings_keep_a_hub_reference_verbatim_and_the_startup_check_lets_it_pass():
    """H3BATCH_RELEASE=hf://org/name@rev survives parsing (no Path folding of //), uses the default HF cache."""
    settings = Settings.from_env({"H3BATCH_RELEASE": "hf://org/name@v1"})
    assert settings.release_dir == "hf://org/name@v1" and settings.hf_cache_dir is None
    check_release_dir(settings.release_dir)  # the worker fetches it; no ConfigError


def test_role_patterns_select_the_files_each_rank_loads(tiny):
    """DiT ranks fetch the contract files and transformer/; the text rank also text_encoder/ and tokenizer/."""
    files = list(release_files(tiny.release_dir))
    dit = set(filter_repo_objects(files, allow_patterns=list(ReleaseRole.DIT.allow_patterns)))
    text = set(filter_repo_objects(files, allow_patterns=list(ReleaseRole.TEXT.allow_patterns)))
    assert {"fastvideo_inference.json", "provenance.json", "modular_model_index.json"} <= dit
    assert {p.split("/")[0] for p in dit} == {"fastvideo_inference.json", "provenance.json",
                                              "modular_model_index.json", "transformer"}
    assert {p.split("/")[0] for p in text - dit} == {"text_encoder", "tokenizer"}  # no processor/ in the tiny one
    assert not any(p.startswith(("scheduler/", "audio_scheduler/")) for p in text)


def test_hub_reference_resolves_offline_to_the_snapshot_at_its_commit(hub):
    """org/name, org/name@main, org/name@<commit> and hf:// all resolve to one snapshot, named by its commit."""
    cache, commit = hub
    for text in (REPO_ID, f"{REPO_ID}@main", f"{REPO_ID}@{commit}", f"hf://{REPO_ID}@{commit}"):
        resolved = resolve_release(text, ReleaseRole.TEXT, cache_dir=cache)
        assert resolved.commit == commit and resolved.path.name == commit, text
    assert validate_release(resolved.path).model_id == REPO_ID


def test_dit_rank_resolves_without_the_conditioner(hub, tmp_path):
    """A DiT-only rank needs no text_encoder/ or tokenizer/: its role resolves and validates without them."""
    cache, commit = hub
    private = Path(shutil.copytree(cache, tmp_path / "hf-cache", symlinks=True))
    snapshot = private / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / commit
    shutil.rmtree(snapshot / "text_encoder")
    shutil.rmtree(snapshot / "tokenizer")
    resolved = resolve_release(REPO_ID, ReleaseRole.DIT, cache_dir=private)
    assert validate_release(resolved.path, conditioner=False).model_id == REPO_ID
    with pytest.raises(ContractError, match="text_encoder"):
        validate_release(resolved.path)


def test_hub_reference_renders_the_same_frames_as_the_folder(tiny, hub, tmp_path):
    """Loaded by reference from the offline cache, the tiny release renders the same MP4 frames as from its folder,
    and the MP4 names both commits (release and base)."""
    from h3batch.worker.pipeline import Pipeline, RenderRequest

    cache, commit = hub
    request = RenderRequest(PROMPT, seconds=4.0, width=128, height=64, seed=5)
    by_ref = Pipeline.load(f"{REPO_ID}@main", device="cpu", hf_cache=cache)
    assert by_ref.provenance["release_commit"] == commit and by_ref.provenance["base_commit"] == tiny.base_commit
    by_ref.render(request, tmp_path / "ref.mp4")
    del by_ref
    by_dir = Pipeline.load(tiny.release_dir, device="cpu", hf_cache=tiny.hf_cache)
    # P4 point 4: the serving video VAE is decoder-only, and decode post-processing goes chunk by chunk.
    assert by_dir.video_vae.encoder is None and by_dir.video_vae.quant_conv is None
    assert by_dir.write_options.tile_batch == 0 and by_dir.write_options.stream_mux
    assert by_dir.provenance["release_commit"] is None and by_dir.provenance["base_commit"] == tiny.base_commit
    by_dir.render(request, tmp_path / "dir.mp4")
    assert np.array_equal(_frames(tmp_path / "ref.mp4"), _frames(tmp_path / "dir.mp4"))
    ref_tags, dir_tags = (probe_mp4(tmp_path / name)["metadata"] for name in ("ref.mp4", "dir.mp4"))
    assert ref_tags["h3batch_release_commit"] == commit and ref_tags["h3batch_base_commit"] == tiny.base_commit
    assert "h3batch_release_commit" not in dir_tags and dir_tags["h3batch_base_commit"] == tiny.base_commit


def test_fetch_release_prints_the_local_folder(hub, capsys):
    """`h3batch fetch-release REF` prints the snapshot folder and exits 0."""
    cache, commit = hub
    assert release_ref.main([f"hf://{REPO_ID}@main", "--hf-cache", str(cache), "--role", "dit"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert Path(out[-1]).name == commit and Path(out[-1]).is_dir()


def test_absent_reference_is_one_line_naming_repo_and_revision(hub, capsys):
    """A reference the offline cache lacks (unknown repo, unknown tag) exits 2 with one line naming both."""
    cache, _ = hub
    for repo, revision in ((REPO_ID, "v9"), ("nobody/nothing", "main")):
        assert release_ref.main([f"{repo}@{revision}", "--hf-cache", str(cache)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"release {repo} at revision {revision} is unavailable" in lines[0], lines


def test_render_cli_with_an_absent_reference_exits_2(hub, tmp_path):
    """`h3batch render --release org/name@rev` that the cache cannot serve answers one line and exit 2."""
    cache, _ = hub
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-P", "-m", "h3batch.cli", "render", "--release", f"hf://{REPO_ID}@v9",
                           "--prompt", "x", "--out", str(tmp_path / "x.mp4")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"release {REPO_ID} at revision v9" in lines[0]
