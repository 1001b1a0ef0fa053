"""`h3batch speech-wav` makes the quickstart's speech.wav: 24 kHz mono PCM16 of the length asked, speech-like frames
with pauses, the same bytes for the same flags, and a file the driver's lifecycle run against the reference server
accepts (docs/loadrunner.md)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import wave

from h3batch.loadrunner.audio import frame_is_speech, load_input_samples, split_frames
from tests.loadrunner.harness import REPO_ROOT, start_server_process, stop_process

H3BATCH = [sys.executable, "-P", "-m", "h3batch.cli"]


def speech_wav(*args: str, cwd, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run([*H3BATCH, "speech-wav", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


def test_without_espeak_ng_a_synthesized_speech_wav_is_written(tmp_path):
    """With no espeak-ng on PATH, `auto` synthesizes: 20 s at 24 kHz mono PCM16 (250 frames of 80 ms), most frames
    voiced and some silent (the pauses), and the same bytes on a second run."""
    no_espeak = str(tmp_path / "empty-bin")  # a PATH with nothing on it: the interpreter is called by full path
    done = speech_wav(cwd=tmp_path, path=no_espeak)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "speech.wav: 20 s, 24 kHz mono PCM16, synth"
    with wave.open(str(tmp_path / "speech.wav")) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24000, 1, 2)
        assert wav.getnframes() == 20 * 24000
    frames = split_frames(load_input_samples(tmp_path / "speech.wav", 0))
    voiced = sum(frame_is_speech(frame) for frame in frames)
    assert len(frames) == 250 and 0.6 * len(frames) < voiced < len(frames)
    first = hashlib.sha256((tmp_path / "speech.wav").read_bytes()).hexdigest()
    again = speech_wav("--out", "again.wav", cwd=tmp_path, path=no_espeak)
    assert again.returncode == 0 and hashlib.sha256((tmp_path / "again.wav").read_bytes()).hexdigest() == first


def test_asking_for_espeak_ng_without_it_is_one_line_exit_2(tmp_path):
    """--engine espeak-ng where it is not installed: exit 2, one line saying how to get it, no file."""
    done = speech_wav("--engine", "espeak-ng", cwd=tmp_path, path=str(tmp_path / "empty-bin"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "apt-get install espeak-ng" in lines[0]
    assert not (tmp_path / "speech.wav").exists()


def test_the_quickstart_runs_on_the_generated_file(tmp_path):
    """The docs' lifecycle command (`h3batch duplex ... --input-wav speech.wav --tail-s 0.5` against a 2-slot
    reference server) succeeds on the file the command wrote."""
    assert speech_wav("--seconds", "2", cwd=tmp_path, path=str(tmp_path / "empty-bin")).returncode == 0
    proc, url = start_server_process(["--port", "0", "--max-sessions", "2"], via_h3batch=True)
    try:
        result = subprocess.run([*H3BATCH, "duplex", "--url", url, "--model", "reference", "--input-wav",
                                 str(tmp_path / "speech.wav"), "--tail-s", "0.5", "--output-dir", str(tmp_path / "o"),
                                 "--timeout-s", "5"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    finally:
        stop_process(proc)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ok"] is True
