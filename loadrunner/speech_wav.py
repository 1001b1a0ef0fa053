"""`h3batch speech-wav [--out speech.wav] [--seconds 20] [--engine auto|espeak-ng|synth]`: the input WAV the load
runner's quickstart needs (docs/loadrunner.md), made on this machine: 24 kHz mono PCM16, `--seconds` long.

`espeak-ng` (Debian package `espeak-ng`) speaks `--text` when it is installed (`auto` picks it then), and its voice is
looped to the length asked. Without it, `synth` writes a speech-like waveform: syllables of 120-300 ms whose pitch
glides around 110-220 Hz, with harmonics shaped by three formant bands that change per syllable, separated by short
pauses and a longer breath every few syllables, from a fixed seed, so the same flags always give the same file
(the driver's `--input-sha256` can pin it). It is no speech, but the driver and the reference server treat it as
such: every syllable frame is well above the `is_speech` threshold and the pauses give the turn-taking gaps. No
library in the lock synthesises speech, and the load runner needs only these few lines of numpy.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from h3batch.cli_args import OneLineArgumentParser
from h3batch.loadrunner.audio import SAMPLE_RATE_HZ, decode_wav, resample_linear, write_pcm16_wav

DEFAULT_TEXT = ("Hello, this is a test of the full duplex speech service. I would like to book a table for two "
                "at seven tonight, somewhere quiet, please. Could you also tell me how long the walk is from the "
                "station, and whether it will rain later?")
FORMANTS = ((300.0, 900.0), (900.0, 2300.0), (2300.0, 3200.0))
"""Ranges (Hz) each syllable's three formant centres are drawn from: the bands of spoken vowels."""


def synthesize(seconds: float, seed: int = 0) -> np.ndarray:
    """Speech-like float samples in [-1, 1] at 24 kHz (see the module docstring for the shape)."""
    rng = np.random.default_rng(seed)
    total = round(seconds * SAMPLE_RATE_HZ)
    out = np.zeros(total)
    at, syllable = round(0.2 * SAMPLE_RATE_HZ), 0
    while at < total:
        length = round(rng.uniform(0.12, 0.30) * SAMPLE_RATE_HZ)
        t = np.arange(length) / SAMPLE_RATE_HZ
        f0 = rng.uniform(110.0, 220.0) * (1 + 0.15 * np.sin(np.pi * t / t[-1] - rng.uniform(0, 1)))
        phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE_HZ
        centres = [rng.uniform(lo, hi) for lo, hi in FORMANTS]
        voice = np.zeros(length)
        for k in range(1, 30):  # harmonics under 7 kHz, weighted by their distance to the formants
            harmonic = k * f0.mean()
            gain = sum(np.exp(-((harmonic - c) / 150.0) ** 2) for c in centres) + 0.02
            voice += gain / k * np.sin(k * phase)
        envelope = np.sin(np.pi * np.arange(length) / length) ** 0.6
        end = min(total, at + length)
        out[at:end] = (voice * envelope)[: end - at]
        syllable += 1
        pause = 0.45 if syllable % 6 == 0 else rng.uniform(0.03, 0.09)
        at = end + round(pause * SAMPLE_RATE_HZ)
    peak = np.max(np.abs(out)) or 1.0
    return 0.6 * out / peak


def espeak(text: str, seconds: float, program: str) -> np.ndarray:
    """`text` spoken by espeak-ng, resampled to 24 kHz and looped (with 0.4 s between) to `seconds`."""
    with tempfile.TemporaryDirectory() as folder:
        wav = Path(folder) / "voice.wav"
        subprocess.run([program, "-w", str(wav), text], check=True, capture_output=True, timeout=120)
        samples, rate = decode_wav(wav)
    voice = np.concatenate([resample_linear(samples, rate), np.zeros(round(0.4 * SAMPLE_RATE_HZ))])
    total = round(seconds * SAMPLE_RATE_HZ)
    return np.tile(voice, -(-total // len(voice)))[:total]


def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="h3batch speech-wav", description="Write the input WAV for `h3batch duplex` "
                                   "(24 kHz mono PCM16): espeak-ng speech when installed, else a synthesized "
                                   "speech-like waveform.")
    parser.add_argument("--out", type=Path, default=Path("speech.wav"), help="where to write it (default speech.wav)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length (default 20 s: 250 frames of 80 ms)")
    parser.add_argument("--engine", choices=("auto", "espeak-ng", "synth"), default="auto",
                        help="auto: espeak-ng if it is on PATH, else synth")
    parser.add_argument("--text", default=DEFAULT_TEXT, help="what espeak-ng says")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthesized waveform (default 0)")
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= 3600:
        parser.error(f"--seconds: expected 0 < seconds <= 3600, found {args.seconds:g}")
    program = shutil.which("espeak-ng")
    engine = args.engine if args.engine != "auto" else ("espeak-ng" if program else "synth")
    if engine == "espeak-ng" and program is None:
        print("h3batch speech-wav: espeak-ng is not installed (apt-get install espeak-ng), or use --engine synth",
              file=sys.stderr)
        return 2
    try:
        samples = espeak(args.text, args.seconds, program) if engine == "espeak-ng" else \
            synthesize(args.seconds, args.seed)
        pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_pcm16_wav(args.out, pcm)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"h3batch speech-wav: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out}: {args.seconds:g} s, 24 kHz mono PCM16, {engine}")
    return 0
