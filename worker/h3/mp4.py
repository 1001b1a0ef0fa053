"""MP4 muxing and probing with PyAV (spec §11.3): H.264 yuv420p CRF 18 at 24 fps + AAC stereo 32 kHz fltp.

``write_mp4`` writes to a temporary file in the target's directory, fsyncs it, then ``os.replace``s it onto the
target and fsyncs the directory, so a reader polling for the file sees either nothing or a complete MP4, and a
failure part-way leaves no target file behind. The moov atom goes first (``+faststart``) so HTTP clients can start
playback before the download ends, and ``+use_metadata_tags`` lets arbitrary string tags (job id, seed, prompt hash)
be stored in the container, not only the few iTunes-style keys the mov muxer knows.

``Mp4Writer`` is the streaming form: open it with the audio, feed RGB frames as each decoded chunk arrives
(``add_frames``), then ``finish`` (flush, fsync, rename) or ``abort``. RGB is converted to Y'CbCr 4:2:0 with the
BT.709 matrix at limited range: frames on a GPU in torch there (``rgb_to_yuv420_bt709``, a box 2x2 chroma), frames
on the CPU by swscale on the encoding thread (about 100x faster than torch on the CPU; its chroma filter differs
by a few levels on noise). The stream is tagged BT.709 (primaries, transfer, matrix, range) so players invert the
same matrix. The libx264 preset is a parameter:
``veryfast`` is the default, chosen by measurement (docs/benchmarks.md, bench/mux.py); ``medium`` is FFmpeg's.
"""

from __future__ import annotations

import os
import queue
import threading
import uuid
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch

VIDEO_CODEC = "libx264"
VIDEO_PIX_FMT = "yuv420p"
VIDEO_RGB = "rgb24"
VIDEO_CRF = 18
VIDEO_PRESET = "veryfast"
"""libx264 preset, chosen by bench/mux.py on the H200 machine (16 cores, CRF 18, 1344x768, 107 frames): on noise
veryfast is 2.1x faster than medium and 5 % smaller, and leaves a 1.4 s streamed tail against medium's 5.3 s; on
smooth content its file is 21 % larger (1.08 vs 0.90 MB). ultrafast cuts the tail further but doubles smooth files
(1.92 MB) and adds 13 % on noise. Figures in docs/benchmarks.md."""
LEGACY_VIDEO_PRESET = "medium"  # FFmpeg's default, what write_mp4 used before the preset was chosen
AUDIO_CODEC = "aac"
AUDIO_FORMAT = "fltp"
AUDIO_LAYOUT = "stereo"
AUDIO_BIT_RATE = 192_000
"""Not fixed by the spec. FFmpeg's default (~128 kb/s) leaves a plain 220 Hz tone at ~17 dB SNR with its native AAC
encoder; 192 kb/s gives ~41 dB for a few kB per second of video."""
MOVFLAGS = "+faststart+use_metadata_tags"


def _as_numpy(array, name: str) -> np.ndarray:
    if isinstance(array, torch.Tensor):
        return array.detach().cpu().numpy()
    if isinstance(array, np.ndarray):
        return array
    raise ValueError(f"{name} must be a numpy array or torch tensor, got {type(array).__name__}")


def _check_audio(audio: np.ndarray, fps: int, sample_rate: int, metadata) -> None:
    if audio.dtype != np.float32 or audio.ndim != 2 or audio.shape[0] != 2 or audio.shape[1] < 1:
        raise ValueError(f"audio must be float32 [2, samples>=1], got {audio.dtype} {list(audio.shape)}")
    if not (isinstance(fps, int) and fps > 0 and isinstance(sample_rate, int) and sample_rate > 0):
        raise ValueError(f"fps and sample_rate must be positive ints, got {fps!r} and {sample_rate!r}")
    for key, value in (metadata or {}).items():
        if not (isinstance(key, str) and key and isinstance(value, str)):
            raise ValueError(f"metadata must map non-empty str keys to str values, got {key!r}: {value!r}")


def _check_size(width: int, height: int) -> None:
    if height % 2 or width % 2 or height < 2 or width < 2:
        raise ValueError(f"frame height and width must be even for yuv420p, got {width}x{height}")


def _check_inputs(frames: np.ndarray, audio: np.ndarray, fps: int, sample_rate: int, metadata) -> None:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < 1:
        raise ValueError(f"frames must be uint8 [N>=1, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    _check_size(frames.shape[2], frames.shape[1])
    _check_audio(audio, fps, sample_rate, metadata)


# BT.709 luma weights (Rec. ITU-R BT.709-6, table 3) and the limited-range scales of 8-bit video.
_KR, _KB = 0.2126, 0.0722
_KG = 1.0 - _KR - _KB
_Y_SCALE, _C_SCALE = 219.0 / 255.0, 224.0 / 255.0


def rgb_to_yuv420_bt709(frames: torch.Tensor) -> torch.Tensor:
    """uint8 RGB ``[n, H, W, 3]`` -> uint8 yuv420p ``[n, 3H/2, W]`` (Y plane, then U, then V, each row-major), the
    layout ``av.VideoFrame.from_ndarray(..., format="yuv420p")`` copies from. BT.709 matrix, limited range
    (Y 16..235, C 16..240), chroma the mean of each 2x2 block. Runs on the frames' device."""
    n, height, width, _ = frames.shape
    rgb = frames.to(torch.float32)
    red, green, blue = rgb.unbind(-1)
    luma = _KR * red + _KG * green + _KB * blue  # 0..255
    cb = (blue - luma) / (2.0 * (1.0 - _KB))  # -127.5..127.5
    cr = (red - luma) / (2.0 * (1.0 - _KR))

    def subsample(chroma: torch.Tensor) -> torch.Tensor:
        return chroma.view(n, height // 2, 2, width // 2, 2).mean(dim=(2, 4)).reshape(n, -1)

    planes = torch.cat(
        [
            (16.0 + _Y_SCALE * luma).reshape(n, -1),
            128.0 + _C_SCALE * subsample(cb),
            128.0 + _C_SCALE * subsample(cr),
        ],
        dim=1,
    )
    return planes.round_().clamp_(0, 255).to(torch.uint8).view(n, height * 3 // 2, width)


class Mp4Writer:
    """One MP4 written as frames arrive: ``add_frames`` per decoded chunk, then ``finish`` (or ``abort``).

    The audio is given up front (it decodes in a fraction of the video's time) so it can be interleaved with the
    frames in time order. Encoded packets are held in memory and muxed by ``finish`` (a few MB per second of
    video): the container header, and with it the tags, is written on the first mux, and ``finish`` may still add
    tags (stage timings known only at the end). Everything goes to a hidden temp file beside ``path``; ``finish``
    flushes the encoders, muxes, fsyncs, renames onto ``path`` and fsyncs the directory. With ``background=True``
    the H.264 encode runs on one worker thread fed through a queue of at most ``queue_chunks`` chunks, so the caller
    (the GPU decode) goes on while libx264 works; errors of that thread are raised by the next ``add_frames`` or by
    ``finish``.
    Used as a context manager, an exception inside the block aborts the write.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        width: int,
        height: int,
        audio,
        *,
        fps: int = 24,
        sample_rate: int = 32000,
        metadata: dict[str, str] | None = None,
        preset: str = VIDEO_PRESET,
        background: bool = False,
        queue_chunks: int = 4,
    ) -> None:
        audio = _as_numpy(audio, "audio")
        _check_size(width, height)
        _check_audio(audio, fps, sample_rate, metadata)
        self.target = Path(path)
        self.width, self.height, self.fps, self.sample_rate = width, height, fps, sample_rate
        self._audio = audio
        self._frames = 0
        self._sent = 0  # audio samples already given to the encoder
        self._packets: list = []  # encoded, not yet muxed, in time-interleaved order
        self._closed = False
        # A unique hidden name beside the target (same filesystem, so os.replace is atomic), with the usual
        # umask-derived permissions.
        self._temp = self.target.with_name(f".{self.target.name}.{uuid.uuid4().hex}.partial")
        try:
            self._open(metadata, preset)
        except BaseException:
            self._temp.unlink(missing_ok=True)
            raise
        self._error: BaseException | None = None
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._queue = queue.Queue(maxsize=max(1, queue_chunks))
            self._thread = threading.Thread(target=self._drain, name="mp4-encode", daemon=True)
            self._thread.start()

    def _open(self, metadata, preset: str) -> None:
        # The muxer opens the file only at the first mux (in finish); create it now so that the partial write is
        # visible as the hidden temp from the start, as before streaming.
        self._temp.touch(exist_ok=False)
        container = av.open(os.fspath(self._temp), mode="w", format="mp4", options={"movflags": MOVFLAGS})
        self._container = container
        for key, value in (metadata or {}).items():
            container.metadata[key] = value
        video = container.add_stream(VIDEO_CODEC, rate=self.fps, options={"crf": str(VIDEO_CRF), "preset": preset})
        video.width, video.height, video.pix_fmt = self.width, self.height, VIDEO_PIX_FMT
        context = video.codec_context
        context.time_base = Fraction(1, self.fps)
        # BT.709 everywhere (AVCOL_PRI_BT709 = AVCOL_TRC_BT709 = AVCOL_SPC_BT709 = 1, AVCOL_RANGE_MPEG = 1).
        context.color_primaries = context.color_trc = context.colorspace = 1
        context.color_range = 1
        sound = container.add_stream(AUDIO_CODEC, rate=self.sample_rate, layout=AUDIO_LAYOUT, format=AUDIO_FORMAT)
        sound.bit_rate = AUDIO_BIT_RATE
        self._video, self._sound = video, sound

    # Feeding ----------------------------------------------------------------------------------------------------

    def add_frames(self, frames) -> None:
        """Append uint8 RGB frames ``[n, H, W, 3]`` (torch on any device, or numpy). GPU frames are converted to
        yuv420p here, on the GPU; CPU frames by swscale where they are encoded (here or on the worker thread)."""
        if self._closed:
            raise RuntimeError("Mp4Writer: add_frames after finish/abort")
        self._raise_worker_error()
        if isinstance(frames, np.ndarray):
            frames = torch.from_numpy(np.ascontiguousarray(frames))
        if not isinstance(frames, torch.Tensor):
            raise ValueError(f"frames must be a numpy array or torch tensor, got {type(frames).__name__}")
        if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"frames must be uint8 [n, H, W, 3], got {frames.dtype} {list(frames.shape)}")
        if tuple(frames.shape[1:3]) != (self.height, self.width):
            raise ValueError(
                f"frames are {frames.shape[2]}x{frames.shape[1]}, the stream is {self.width}x{self.height}"
            )
        if frames.shape[0] == 0:
            return
        if frames.device.type == "cpu":
            item = (VIDEO_RGB, frames.numpy())
        else:
            item = (VIDEO_PIX_FMT, rgb_to_yuv420_bt709(frames).cpu().numpy())
        if self._queue is None:
            self._encode(item)
            return
        while True:  # bounded wait so that a dead worker cannot block the caller forever
            self._raise_worker_error()
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _encode(self, item: tuple[str, np.ndarray]) -> None:
        """Encode (format, frames): yuv420p planes ``[n, 3H/2, W]`` as they are, rgb24 ``[n, H, W, 3]`` through
        swscale's BT.709 limited-range matrix."""
        video, sound, packets = self._video, self._sound, self._packets
        num_samples = self._audio.shape[1]
        pixel_format, frames = item
        for array in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(array), format=pixel_format)
            if pixel_format == VIDEO_RGB:
                frame = frame.reformat(format=VIDEO_PIX_FMT, dst_colorspace="ITU709", dst_color_range="MPEG")
            frame.colorspace, frame.color_range = 1, 1  # BT.709, limited range
            frame.pts = self._frames
            frame.time_base = Fraction(1, self.fps)
            packets.extend(video.encode(frame))
            self._frames += 1
            # Audio in step with the frames (samples up to the end of this frame), so the muxer interleaves the
            # streams in time order instead of writing all video before all audio.
            until = min(num_samples, self._frames * self.sample_rate // self.fps)
            if until > self._sent:
                chunk = self._audio[:, self._sent:until]
                packets.extend(sound.encode(_audio_frame(chunk, self._sent, self.sample_rate)))
                self._sent = until

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue  # keep consuming so a producer never blocks on a dead worker
            try:
                self._encode(item)
            except BaseException as exc:  # noqa: BLE001 - handed to the producer
                self._error = exc

    def _raise_worker_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _stop_worker(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    # Ending -----------------------------------------------------------------------------------------------------

    @property
    def frames_written(self) -> int:
        return self._frames

    def finish(self, metadata: dict[str, str] | None = None) -> Path:
        """Flush, add ``metadata`` tags, mux, fsync and rename onto the target; returns it. On any error the temp
        file is removed."""
        if self._closed:
            raise RuntimeError("Mp4Writer: finish after finish/abort")
        try:
            self._stop_worker()
            self._raise_worker_error()
            if self._frames == 0:
                raise ValueError("Mp4Writer: no frames were added")
            _check_audio(self._audio, self.fps, self.sample_rate, metadata)
            container, sound = self._container, self._sound
            for key, value in (metadata or {}).items():
                container.metadata[key] = value
            num_samples = self._audio.shape[1]
            if self._sent < num_samples:  # audio longer than the video
                self._packets.extend(sound.encode(_audio_frame(self._audio[:, self._sent:], self._sent,
                                                               self.sample_rate)))
                self._sent = num_samples
            self._packets.extend(self._video.encode(None))
            self._packets.extend(sound.encode(None))
            container.mux(self._packets)
            self._packets = []
            self._closed = True
            container.close()
            with open(self._temp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(self._temp, self.target)
        except BaseException:
            self.abort()
            raise
        _fsync_directory(self.target.parent)
        return self.target

    def abort(self) -> None:
        """Stop, close and delete the temp file; the target is left as it was. Safe to call twice."""
        self._closed = True
        try:
            self._stop_worker()
        finally:
            try:
                self._container.close()
            except Exception:  # noqa: BLE001 - a half-written container may refuse to close cleanly
                pass
            self._temp.unlink(missing_ok=True)

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._closed:  # left without finish(): an exception, or a caller that gave up
            self.abort()


def _audio_frame(chunk: np.ndarray, start: int, sample_rate: int) -> av.AudioFrame:
    """Planar float frame of ``chunk`` [2, n] starting at sample ``start``; the encoder re-cuts it to 1024-sample
    AAC frames."""
    wave = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format=AUDIO_FORMAT, layout=AUDIO_LAYOUT)
    wave.sample_rate = sample_rate
    wave.pts = start
    wave.time_base = Fraction(1, sample_rate)
    return wave


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_mp4(
    path: str | os.PathLike,
    frames,
    audio,
    fps: int = 24,
    sample_rate: int = 32000,
    metadata: dict[str, str] | None = None,
    preset: str = VIDEO_PRESET,
) -> Path:
    """Write frames ``[N, H, W, 3]`` uint8 and audio ``[2, samples]`` float32 in [-1, 1] to ``path`` atomically.

    Raises ValueError on malformed inputs (before anything is written). Returns the target path. The frames are
    taken one at a time (an iterable of ``[H, W, 3]`` is enough once the array checks pass).
    """
    frames = _as_numpy(frames, "frames")
    audio = _as_numpy(audio, "audio")
    _check_inputs(frames, audio, fps, sample_rate, metadata)
    writer = Mp4Writer(path, frames.shape[2], frames.shape[1], audio, fps=fps, sample_rate=sample_rate,
                       metadata=metadata, preset=preset)
    with writer:
        for rgb in frames:
            writer.add_frames(np.asarray(rgb)[None])
        return writer.finish()


def probe_mp4(path: str | os.PathLike) -> dict:
    """Decode ``path`` fully and describe it.

    Keys: ``video_codec``, ``width``, ``height``, ``pix_fmt``, ``frames`` (decoded count), ``average_fps`` (Fraction),
    ``video_duration_s``, ``audio_codec``, ``channels``, ``sample_rate``, ``audio_format``, ``audio_samples``
    (decoded per channel), ``audio_duration_s`` (stream duration, priming excluded by the edit list),
    ``duration_s`` (container), ``metadata`` (container tags). A missing stream raises ValueError.
    """
    with av.open(os.fspath(path), mode="r") as container:
        if len(container.streams.video) != 1 or len(container.streams.audio) != 1:
            raise ValueError(
                f"{path}: expected one video and one audio stream, got {len(container.streams.video)} video and "
                f"{len(container.streams.audio)} audio"
            )
        video = container.streams.video[0]
        sound = container.streams.audio[0]
        info = {
            "video_codec": video.codec_context.name,
            "width": video.codec_context.width,
            "height": video.codec_context.height,
            "pix_fmt": video.codec_context.pix_fmt,
            "average_fps": video.average_rate,
            "video_duration_s": float(video.duration * video.time_base) if video.duration else None,
            "audio_codec": sound.codec_context.name,
            "channels": sound.codec_context.channels,
            "sample_rate": sound.codec_context.sample_rate,
            "audio_format": sound.codec_context.format.name if sound.codec_context.format else None,
            "audio_duration_s": float(sound.duration * sound.time_base) if sound.duration else None,
            "duration_s": container.duration / av.time_base if container.duration else None,
            "metadata": dict(container.metadata),
        }
        info["frames"] = sum(1 for _ in container.decode(video=0))
        container.seek(0)
        info["audio_samples"] = sum(frame.samples for frame in container.decode(audio=0))
    return info
