"""One resident FastH3 V2 pipeline: load a release once, then render prompts to MP4 files.

Data flow of `Pipeline.render` (spec h3-model.md §1.2):

    prompt ──tokenize+Qwen3-VL──▶ text [1,L,text_dim] ──refiner (once)──▶ refined text rows
    seed ──CPU generator──▶ video noise [1,24,T,Hl,Wl] + audio noise [2A,32]
    8 × ( row timesteps (t_v, t_a) → DiT forward (VSA-H3) → Euler update per modality )
    video latents ──VAE──▶ uint8 frames [N,H,W,3];  audio rows ──audio VAE──▶ waveform [2,800A]
    frames + waveform ──PyAV──▶ MP4 (H.264 24 fps + AAC stereo 32 kHz), written atomically

`Pipeline.load` does every check a worker must pass before it takes a job: the release reference (a directory or a Hub
repo at a revision, worker/h3/release_ref.py), the release contract, the base-VAE fetch at the provenance revision and
a strict weight load. What the weights are is kept in `Pipeline.provenance` (the commits the release and base
revisions resolved to), logged at load, written into every MP4 and onto every job record (worker/job_metadata.py).
The job service (worker/resident.py) keeps one instance per worker process.
`render` is `denoise` (text encode + 8 steps) then `write` (decode + mux): a sequence-parallel rank group
(worker/rank_group.py) runs `denoise` on every rank and `write` on rank 0 only.

`write` follows `WriteOptions`. The default streams: the video VAE decodes all tiles of a temporal chunk in one
call and each chunk's frames go straight to an `mp4.Mp4Writer` whose libx264 encode runs on a thread while the next
chunk decodes, so `timings["mux"]` is only the tail after the last chunk (flush, mux, fsync, rename).
`WriteOptions.legacy()` is the pre-streaming path (diffusers' per-tile decode, then a whole-clip libx264 medium
encode), kept for bench/e2e.py's baseline. On CUDA `load` keeps a decoder-only fp16 copy of the video VAE with each
ViT block compiled, and `warm_up` runs every compiled path once so that no job pays a first-call compile.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from h3batch.core import routing
from h3batch.core.geometry import RequestGeometry, check_canvas_area
from h3batch.worker.h3 import base_vae_fetch, contract, decode, mp4, packing, release_ref, vae_checkpoint_convert
from h3batch.worker.h3 import memory_plan as memory_plan
from h3batch.worker.h3.adapters import WorkerLoras
from h3batch.worker.h3.legacy_adapter import (
    LegacyAdapter,
    adapter_folder,
    fuse_legacy_adapter,
    read_legacy_adapter,
    refuse_on_full_checkpoint,
    sigma_summary,
)
from h3batch.worker.h3.loader import load_transformer
from h3batch.worker.h3.sampler import SigmaLadder, initial_noise
from h3batch.worker.h3.vsa_plan import vsa_plan_for_layout

if TYPE_CHECKING:  # transformers is imported by `load` only: rank-group ranks other than 0 never need it
    from h3batch.worker.h3.text_encoder import TextEncoder

log = logging.getLogger("h3batch.pipeline")

STAGES = ("text_encode", "denoise", "decode", "mux")
"""Render stages in order; `denoise` reports step 0 on entry, then steps 1..8 as each forward ends."""
WARM_UP_DIT_BLOCKS = 1
"""DiT blocks the warm-up step runs: the 50 blocks have one shape, so the first compiles and loads every kernel the
others use (FlexAttention / VSA, the fused ops, the fp8 quantizer); the other 49 would only add ~3 s of arithmetic
to worker start (issue 25's warm-start goal)."""
WARM_UP_DECODE_CHUNKS = 2
"""Temporal chunks the warm-up decodes: every chunk of a 5n+2-latent-frame clip has one shape (7 latent frames, the
same tiles), so the first two (the first, and one after a cross-fade) compile what the rest would only repeat."""

ProgressFn = Callable[[str, int, int], None]
"""on_progress(stage, step, total): step/total count denoise forwards (0 on entry); other stages report (0, 0) on
entry."""


@dataclass(frozen=True)
class WriteOptions:
    """How `Pipeline.write` turns latents into the MP4."""

    tile_batch: int | None = 0  # tiles per VAE decoder call; 0 = all tiles of a temporal chunk; None = per tile
    stream_mux: bool = True  # encode each decoded chunk on a writer thread while the next one decodes
    preset: str = mp4.VIDEO_PRESET  # libx264 preset

    @classmethod
    def legacy(cls) -> WriteOptions:
        """The path before P2: diffusers' per-tile `vae.decode`, then the whole clip encoded with libx264 medium."""
        return cls(tile_batch=None, stream_mux=False, preset=mp4.LEGACY_VIDEO_PRESET)


LEGACY_PLAN_SPARSITY = 0.5
"""Any sparsity < 1 builds the VSA plan that H3BATCH_ADAPTER's fixed top-k then overrides."""
IMPLEMENTED_TASKS = {"v2": ("t2va",), "native": ("t2va", "fl2va", "ref2va")}
"""The tasks this pipeline renders per release kind (a release's layout may hold more: `info.tasks`)."""
NATIVE_MIN_SECONDS = routing.NATIVE_MIN_SECONDS  # the API refuses shorter native jobs at submission too
NATIVE_RANKS_REFUSAL = ("H3BATCH_RANKS={ranks}: a native MiniMax-H3 release is served by one GPU per worker "
                        "(H3BATCH_RANKS=1); sequence-parallel rank groups serve FastH3 V2 releases only")


def info_kind(info: contract.ReleaseInfo) -> str:
    return info.kind.value


@dataclass(frozen=True, eq=False)
class Vision:
    """What the native release's keyframe / reference tasks load beside t2va: the Qwen3-VL image processor and the
    video VAE with its encoder (fp32; the serving decoder copy drops its encoder)."""

    image_processor: Any
    video_encoder: Any


def load_vision(root: Path, device: torch.device) -> Vision:
    from transformers import Qwen2VLImageProcessorPil  # the PIL backend: the same numbers without torchvision

    encoder_vae, _ = load_native_vaes(root)
    encoder_vae.decoder = None  # encode only: the serving decoder is its own copy (decode.prepare_video_decoder)
    return Vision(Qwen2VLImageProcessorPil.from_pretrained(root / contract.PROCESSOR_DIR),
                  encoder_vae.to(device).eval())


def load_native_vaes(root: Path):
    """The native release's video and audio VAEs from its Diffusers-format `vae/` and `audio_vae/` (fp32, CPU)."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

    return (AutoencoderKLMiniMaxH3.from_pretrained(root / contract.VIDEO_VAE_DIR, torch_dtype=torch.float32),
            AutoencoderKLMiniMaxH3Audio.from_pretrained(root / contract.AUDIO_VAE_DIR, torch_dtype=torch.float32))


class RenderCancelled(Exception):
    """The caller asked to stop; raised at the next step boundary, nothing is written."""


@dataclass(frozen=True)
class RenderRequest:
    """One T2VA request as the pipeline takes it (already-resolved values; the API applies defaults)."""

    prompt: str
    seconds: float = 4.0
    width: int = 256
    height: int = 128
    seed: int = 0
    metadata: tuple[tuple[str, str], ...] = ()  # extra MP4 tags (job id, resolved params, versions), in order
    task: str = "t2va"  # t2va | fl2va | ref2va (core/routing.TASKS); fl2va and ref2va need the native release
    first_frame: Any = None  # fl2va: the keyframe the clip starts from (a PIL image or an image file path)
    last_frame: Any = None  # fl2va: the keyframe the clip ends on
    references: tuple[Any, ...] = ()  # ref2va: reference images, in the order the prompt reads them


@dataclass(frozen=True)
class RenderResult:
    path: Path
    seed: int
    timings: dict[str, float]  # seconds per stage
    tokens: dict[str, int]  # text, audio_rows, video_rows, sequence
    frames: int
    width: int
    height: int
    seconds: float  # video duration N/24
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class DenoisedClip:
    """A request after the 8 denoising steps: latent rows on the pipeline's device, ready to decode."""

    request: RenderRequest
    geometry: RequestGeometry
    layout: packing.PackedLayout  # CPU tensors
    video: torch.Tensor  # fp32 [1, Nv, 96] patch rows
    audio: torch.Tensor  # fp32 [1, 2A, 32] channel-major rows
    timings: dict[str, float]  # text_encode, denoise so far


def validate_request(req: RenderRequest) -> None:
    """Refuse a request no release can render (ValueError naming the field); needs no loaded model."""
    if not isinstance(req.prompt, str) or not req.prompt.strip():
        raise ValueError("prompt: expected a non-empty string")
    images = {"first_frame": req.first_frame is not None, "last_frame": req.last_frame is not None,
              "references": bool(req.references)}
    expected = {"t2va": (), "fl2va": ("first_frame", "last_frame"), "ref2va": ("references",)}
    if req.task not in expected:
        raise ValueError(f"task: expected one of {', '.join(expected)}, found {req.task!r}")
    stray = [name for name, given in images.items() if given and name not in expected[req.task]]
    if stray:
        raise ValueError(f"{stray[0]}: not an input of task {req.task} (its inputs: "
                         f"{', '.join(expected[req.task]) or 'the prompt only'})")
    if expected[req.task] and not any(images[name] for name in expected[req.task]):
        raise ValueError(f"{expected[req.task][0]}: task {req.task} needs "
                         f"{' and/or '.join(expected[req.task])}, found none")
    RequestGeometry(req.width, req.height, req.seconds)
    check_canvas_area(req.width, req.height)  # the request contract's area cap, as the API refuses it
    if isinstance(req.seed, bool) or not isinstance(req.seed, int) or not 0 <= req.seed < 2**63:
        raise ValueError(f"seed: expected an integer in [0, 2**63), got {req.seed!r}")


def _stop_check(should_cancel: Callable[[], bool] | None, timings: dict[str, float]) -> Callable[[], None]:
    """A step-boundary check: raises RenderCancelled when `should_cancel()` says so."""
    cancelled = should_cancel or (lambda: False)

    def boundary() -> None:
        if cancelled():
            raise RenderCancelled(f"cancelled after {sum(timings.values()):.2f} s")

    return boundary


def provenance_of(info: contract.ReleaseInfo, release: release_ref.ResolvedRelease,
                  base: base_vae_fetch.BaseVaes | None) -> dict[str, str | None]:
    """Where the weights came from, as job records keep it: the release reference and commit, the base repo, its
    provenance revision and the commit that revision resolved to (None where not known: a release directory has no
    commit; a DiT-only rank never fetches the base)."""
    ref = release.ref
    return {"release": str(ref), "release_repo": ref.repo_id, "release_revision": ref.revision if ref.is_hub else None,
            "release_commit": release.commit, "base_repo": info.base_repo_id, "base_revision": info.base_revision,
            "base_commit": base.commit if base is not None else None}


def provenance_tags(provenance: dict[str, str | None]) -> dict[str, str]:
    """MP4 tags of a provenance: `h3batch_base_commit`, and `h3batch_release_commit` for a release from the Hub."""
    tags = {"h3batch_base_commit": provenance.get("base_commit"),
            "h3batch_release_commit": provenance.get("release_commit")}
    return {key: value for key, value in tags.items() if value}


def module_bytes(module: torch.nn.Module | None, *, device: torch.device | None = None) -> int:
    """Bytes of a module's parameters and buffers (only those on `device` when given)."""
    if module is None:
        return 0
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors if device is None or t.device.type == device.type)


def device_memory_bytes(device: torch.device) -> int:
    """Memory of one device as the plan sees it: the GPU's total, or this host's RAM for the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def plan_for(device: torch.device, dit, text, video_vae, audio_vae, *, ranks: int = 1,
             canvas: tuple[int, int] = (1344, 768), placement: str = "auto") -> memory_plan.MemoryPlan:
    """The memory plan from the loaded modules' own bytes (the text stack as it runs: embeddings + kept layers;
    the largest streamed unit is its widest layer or the embedding table), with the activation costs measured on
    this kind of device: the H200's on a GPU, the CPU's (scaled by the DiT's heads) on the CPU."""
    stack = text.text_stack
    units = [stack.embed_tokens, *stack.layers]
    sizes = memory_plan.PartSizes(dit=module_bytes(dit), text_encoder=module_bytes(stack),
                                  text_unit=max(module_bytes(unit) for unit in units),
                                  video_vae=module_bytes(video_vae), audio_vae=module_bytes(audio_vae))
    calibration = (memory_plan.H200_CALIBRATION if device.type == "cuda"
                   else memory_plan.cpu_calibration(dit.config.num_attention_heads, dit.config.hidden_size))
    return memory_plan.plan(sizes, gpu_bytes=device_memory_bytes(device), ranks=ranks, canvas=canvas,
                            placement=placement, calibration=calibration)


@contextlib.contextmanager
def first_blocks(dit, count: int) -> Iterator[None]:
    """Within the block, `dit` runs only its first `count` DiT blocks (warm-up only); restored on exit."""
    blocks = getattr(dit, "blocks", None)
    if blocks is None or len(blocks) <= count:
        yield
        return
    dit.blocks = torch.nn.ModuleList(list(blocks)[:count])
    try:
        yield
    finally:
        dit.blocks = blocks


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class Pipeline:
    """The loaded release: DiT, text encoder and both VAEs, resident on one device."""

    def __init__(self, info: contract.ReleaseInfo, dit, text_encoder: TextEncoder, video_vae, audio_vae, device,
                 provenance: dict[str, str | None] | None = None, *, write_options: WriteOptions | None = None):
        self.info = info
        self.provenance = dict(provenance or {})
        self.release_dir = Path(info.path)
        self.release_id = info.model_id
        self.contract_hash = info.contract_hash
        self.dit = dit
        self.text_encoder = text_encoder
        self.video_vae = video_vae
        self.audio_vae = audio_vae
        self.device = device
        native = info.native
        self.ladder = (SigmaLadder.v2() if native is None
                       else SigmaLadder.native(native.grid_points, native.video_shift, native.audio_shift))
        self.sparsity = float(info.vsa_sparsity)  # 0.0: dense attention (the native release has no VSA gates)
        self.canvas = info.canvas  # default size and bucket budget of this release (callers resolve sizes with it)
        self.write_options = write_options or WriteOptions()
        self.memory_plan: memory_plan.MemoryPlan | None = None  # set by `load`; None for a DiT-only rank
        self.vision: Vision | None = None  # fl2va / ref2va inputs (native release only): set by `load`
        self.ref_dit = None  # ref2va's DiT, the native release's transformer_ref/ partition: set by `load`
        # Per-job LoRAs on `dit` (worker/h3/adapters.py): set by `load` for a native release without H3BATCH_ADAPTER.
        # None: this release takes none (FastH3 V2 is a full checkpoint; a fused legacy adapter excludes them).
        self.loras: WorkerLoras | None = None
        self.adapter: LegacyAdapter | None = None  # H3BATCH_ADAPTER, fused into `dit` at load
        self.vsa_topk: int | None = None  # H3BATCH_ADAPTER's fixed VSA top-k (None: the plan's own)

    @property
    def takes_loras(self) -> bool:
        """Whether jobs may name per-job LoRAs here (core/loras.py; the attempt refuses them otherwise)."""
        return self.loras is not None

    def use_loras(self, items: Sequence[dict]) -> int:
        """Make the DiT carry exactly the job's adapters (core/loras.py records); returns how many adapter sets were
        applied (0 when the set was already applied, as for the next job of a batch). AdapterError when one does not
        fit this DiT."""
        if self.loras is None:
            return 0
        before = self.loras.applies
        self.loras.use(items)
        return self.loras.applies - before

    @property
    def release_kind(self) -> str:
        return info_kind(self.info)

    @property
    def tasks(self) -> tuple[str, ...]:
        """The tasks this pipeline renders: the release's (`info.tasks`) that this code path implements and, past
        t2va, has the vision inputs loaded for (with H3BATCH_ADAPTER, only the tasks the adapter distils)."""
        served = tuple(t for t in self.info.tasks if t in IMPLEMENTED_TASKS[self.release_kind]
                       and (t == "t2va" or self.vision is not None) and (t != "ref2va" or self.ref_dit is not None))
        return served if self.adapter is None else tuple(t for t in served if t in self.adapter.sampling.tasks)

    @property
    def precision(self) -> str:
        """The DiT's serving precision, H3BATCH_PRECISION: `bf16` or `fp8` (worker/h3/precision.py)."""
        from h3batch.worker.h3.precision import precision_of

        return precision_of(self.dit)

    @classmethod
    def load(cls, release: str | Path, *, device: str | torch.device | None = None,
             hf_cache: str | Path | None = None, require_pinned_base: bool = False,
             warm_up: Sequence[RenderRequest] | None = None, text_placement: str = "auto",
             ranks: int = 1, precision: str = "bf16", adapter: str | None = None,
             lora_cache_mb: int = 2048) -> Pipeline:
        """Resolve the release (a directory or a Hub reference), validate it, fetch the base VAEs at the provenance
        revision and load every model; raises ValueError on any violation (the reference, contract and fetch errors
        are one line naming what failed).

        On CUDA the video VAE is kept decoder-only in fp16 with compiled ViT blocks, and `warm_up` (default: one
        request at the release's default canvas) runs before returning, so the caller reports ready only once no
        first-job compile is left. On CPU the fp32 VAE is used as loaded and nothing is warmed up.

        The memory plan (worker/h3/memory_plan.py) for `ranks` GPUs like this one is made from the loaded modules'
        bytes and logged; it places the text encoder (`text_placement`: auto, resident, offload, stream; see
        worker/h3/text_placement.py) and is kept as `memory_plan` (its `max_rows` is what this worker serves).

        `precision` is H3BATCH_PRECISION (worker/h3/precision.py): `bf16` loads the DiT as released; `fp8`
        quantizes its block linears once, after loading (refused before any loading on a GPU without e4m3 GEMMs).

        `adapter` is H3BATCH_ADAPTER, the legacy FastH3 adapter (a folder or `org/name@revision`): on a native release
        it is fused into the DiT before precision and sharding, and its own ladder and VSA top-k replace the
        release's; on a V2 release, or one it does not fit, a LegacyAdapterError (a ValueError) names the variable and
        the first bad key. Without it a native release takes per-job LoRAs, `lora_cache_mb` of factors kept loaded
        (worker/h3/adapters.py); see docs/adapters.md."""
        from h3batch.worker.h3.precision import apply_precision, check_device, check_precision
        from h3batch.worker.h3.text_encoder import TextEncoder
        from h3batch.worker.h3.text_placement import place_text_encoder

        device = torch.device(device) if device is not None else default_device()
        precision = check_precision(precision)
        check_device(precision, device)
        resolved = release_ref.resolve_release(release, release_ref.ReleaseRole.TEXT, cache_dir=hf_cache)
        info = contract.validate_release(resolved.path, require_pinned_base=require_pinned_base)
        native = info.kind is contract.ReleaseKind.NATIVE
        if native and ranks > 1:
            raise ValueError(NATIVE_RANKS_REFUSAL.format(ranks=ranks))
        log.info("release %s (%s, tasks %s): %s", info.model_id, info.kind.value, ",".join(info.tasks),
                 info.startup_log_line)
        if adapter:  # H3BATCH_ADAPTER edits the native base only (docs/adapters.md); refused before any weight loads
            refuse_on_full_checkpoint(info.kind.value)
            if "t2va" not in info.tasks:
                raise ValueError("H3BATCH_ADAPTER: the legacy FastH3 adapter distils t2va, which this release lacks")
        root = Path(info.path)
        vision = None
        if native:  # the native release carries its own Diffusers-format VAEs: nothing is fetched
            base = None
            provenance = provenance_of(info, resolved, None)
            video_vae, audio_vae = load_native_vaes(root)
            if "fl2va" in info.tasks:  # the keyframe path: image processor + the video VAE's encoder (only here)
                vision = load_vision(root, device)
        else:
            base = base_vae_fetch.resolve_base_vaes(info, cache_dir=hf_cache, require_pinned=require_pinned_base)
            provenance = provenance_of(info, resolved, base)
            log.info("release %s commit %s; base %s@%s resolved to commit %s", provenance["release"],
                     provenance["release_commit"] or "(local directory)", base.repo_id, base.revision, base.commit)
            video_vae = vae_checkpoint_convert.load_video_vae(base.root)
            audio_vae = vae_checkpoint_convert.load_audio_vae(base.root)
        dit = load_transformer(root / "transformer", vsa_gates=not native, device=device)
        legacy = None
        if adapter:  # fused before precision and any sharding: the adapter edits the bf16 weights as released
            legacy = read_legacy_adapter(adapter_folder(adapter, hf_cache))
            changed = fuse_legacy_adapter(dit, legacy)
            log.info("H3BATCH_ADAPTER %s (%s): %d parameters fused; its %d steps replace the release's",
                     adapter, legacy.identity, len(changed), legacy.sampling.num_steps)
        dit = apply_precision(dit, precision)
        ref_dit = None
        if native and "ref2va" in info.tasks:  # the second partition: only a release that has it serves ref2va
            ref_dit = apply_precision(load_transformer(root / contract.REF_TRANSFORMER_DIR, vsa_gates=False,
                                                       device=device), precision)
        cuda = device.type == "cuda"
        # Decoder only, on every device: the encoder (0.67 GiB at V2 size) is dropped before the move, so it never
        # reaches the GPU; decode post-processing then runs per temporal chunk (WriteOptions.tile_batch=0).
        video_vae = decode.prepare_video_decoder(video_vae.eval(), torch.float16 if cuda else None,
                                                 compile_blocks=cuda).to(device)
        audio_vae = audio_vae.to(device).eval()
        # The encoder loads into host memory; the plan decides whether its text stack moves to the GPU.
        text = TextEncoder.load(root / "text_encoder", root / "tokenizer", info.text_hidden_layer,
                                "cpu" if cuda else device)
        plan = plan_for(device, dit, text, video_vae, audio_vae, ranks=ranks, canvas=info.canvas.default,
                        placement=text_placement)
        text = place_text_encoder(text, device, plan.placement, keep_max_rows=plan.keep_encoder_max_rows)
        log.info("memory plan (%s):\n%s", device, memory_plan.format_plan(plan))
        pipe = cls(info, dit, text, video_vae, audio_vae, device, provenance)
        pipe.vision = vision
        pipe.ref_dit = ref_dit
        if legacy is not None:
            pipe.adapter = legacy
            pipe.ladder = legacy.sampling.ladder(info.native.video_shift, info.native.audio_shift)
            if legacy.sampling.vsa_topk is not None:  # the student's fixed top-k: a plan is built, its k replaced
                pipe.sparsity, pipe.vsa_topk = LEGACY_PLAN_SPARSITY, legacy.sampling.vsa_topk
            pipe.provenance.update({"adapter": adapter, "adapter_model": legacy.identity,
                                    "adapter_steps": legacy.sampling.num_steps})
            log.info("legacy adapter sampling: %d forwards, %s, VSA top-k %s", legacy.sampling.num_steps,
                     sigma_summary(pipe.ladder), legacy.sampling.vsa_topk or "none (dense)")
        elif native:
            pipe.loras = WorkerLoras(dit, lora_cache_mb << 20, hf_cache)
        pipe.memory_plan = plan
        if cuda:
            canvas = pipe.canvas
            default = RenderRequest(prompt="warm-up", width=canvas.default_width, height=canvas.default_height)
            pipe.warm_up(warm_up if warm_up is not None else (default,))
        return pipe

    def geometry(self, req: RenderRequest) -> RequestGeometry:
        return RequestGeometry(req.width, req.height, req.seconds)

    def validate(self, req: RenderRequest) -> None:
        """Refuse a request this release cannot render (ValueError naming the field)."""
        validate_request(req)
        if req.task not in self.tasks:
            raise ValueError(f"task: this worker renders {', '.join(self.tasks)} ({self.release_kind} release), "
                             f"found {req.task!r}")
        if self.info.kind is contract.ReleaseKind.NATIVE and req.seconds < NATIVE_MIN_SECONDS:
            raise ValueError(f"seconds: expected {NATIVE_MIN_SECONDS:g} to 15 on the native MiniMax-H3 release "
                             f"(diffusers' min_duration), found {req.seconds!r}")

    def close(self) -> None:
        """Nothing to stop: the models live in this process (a rank group's `close` stops its processes)."""

    @torch.inference_mode()
    def render(self, req: RenderRequest, out_path: str | Path, *, on_progress: ProgressFn | None = None,
               should_cancel: Callable[[], bool] | None = None) -> RenderResult:
        """Render `req` to `out_path` (atomic write). Raises RenderCancelled at a step boundary when asked."""
        clip = self.denoise(req, on_progress=on_progress, should_cancel=should_cancel)
        return self.write(clip, out_path, on_progress=on_progress, should_cancel=should_cancel)

    @torch.inference_mode()
    def warm_up(self, requests: Sequence[RenderRequest]) -> float:
        """Run each compiled path once per geometry in `requests`: text encode, one DiT step through the first
        `WARM_UP_DIT_BLOCKS` blocks, the first `WARM_UP_DECODE_CHUNKS` chunks of the video decode of those latents
        (the compiled decoder at this geometry's tile batch) and the audio decode. Writes nothing; returns the
        seconds spent."""
        t0 = time.perf_counter()
        for req in requests:
            with first_blocks(self.dit, WARM_UP_DIT_BLOCKS):
                clip = self.denoise(req, steps=1)
            geo = clip.geometry
            latents = packing.unpatchify_video(clip.video, geo.latent_frames, geo.latent_height, geo.latent_width)
            if self.write_options.tile_batch is None:
                decode.decode_video(self.video_vae, latents)
            else:
                frames = decode.iter_video_frames(self.video_vae, latents, tile_batch=self.write_options.tile_batch)
                for _, _ in zip(range(WARM_UP_DECODE_CHUNKS), frames):
                    pass
                frames.close()
            decode.decode_audio(self.audio_vae, clip.audio[0])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        log.info("warm-up of %d geometr%s: %.1f s", len(requests), "y" if len(requests) == 1 else "ies", seconds)
        return seconds

    @torch.inference_mode()
    def denoise(self, req: RenderRequest, *, on_progress: ProgressFn | None = None,
                should_cancel: Callable[[], bool] | None = None, steps: int | None = None) -> DenoisedClip:
        """Stages text_encode and denoise: the prompt and seed to final latents. Checks `should_cancel` at the
        start and before every step (9 boundaries, in the same order on every call). `steps` stops early (warm-up
        only: the latents are then not a finished clip)."""
        self.validate(req)
        geo = self.geometry(req)
        progress = on_progress or (lambda stage, step, total: None)
        timings: dict[str, float] = {}
        boundary = _stop_check(should_cancel, timings)

        # 1. Text: features [1, L, text_dim] and the timestep-independent refiner output (once per request).
        boundary()
        progress("text_encode", 0, 0)
        t0 = time.perf_counter()
        generator = torch.Generator(device="cpu").manual_seed(req.seed)  # the request's: conditions draw first
        conditions: list[torch.Tensor] = []  # fl2va keyframe rows, noised to their anchor time, in packed order
        if req.task == "t2va":
            features, text_rows = self.text_encoder.encode(req.prompt)
            layout = packing.build_packed_layout(text_rows, geo)
        else:
            features, layout, conditions = self._condition(req, geo, generator)
        settle = getattr(self.text_encoder, "settle", None)
        if settle is not None:  # a hosted encoder leaves the GPU unless this clip fits beside it
            settle(layout.sequence_length)
        dit = self.ref_dit if req.task == "ref2va" else self.dit
        refined = dit.refine_text(features.to(self.device))
        plan = vsa_plan_for_layout(layout, sparsity=self.sparsity) if self.sparsity > 0 else None  # None: dense
        if plan is not None and self.vsa_topk is not None:  # H3BATCH_ADAPTER's fixed top-k
            plan = dataclasses.replace(plan, top_k=min(self.vsa_topk, plan.num_video_tiles))
        dev_layout = layout.to(self.device)
        timings["text_encode"] = time.perf_counter() - t0

        # 2. Denoise: 8 forwards from seeded noise; latent state fp32 on the device.
        total = self.ladder.num_steps
        run_steps = total if steps is None else min(total, steps)
        t0 = time.perf_counter()
        video_noise, audio = initial_noise(req.seed, geo, generator=generator)
        video = packing.patchify_video(video_noise).to(self.device)  # [1, Nv, 96] generated rows
        held = torch.cat(conditions, dim=1).to(self.device) if conditions else None  # [1, C, 96] keyframe rows
        audio = audio.unsqueeze(0).to(self.device)  # [1, 2A, 32]
        # The stage is reported before its first forward (step 0 of total), so a failure inside step 1 is recorded
        # as stage denoise, not as the text_encode before it (issue 30).
        progress("denoise", 0, total)
        c = layout.condition_rows
        for k in range(run_steps):
            boundary()
            t_video, t_audio = self.ladder.timesteps(k)
            timestep, timestep_indices = packing.row_timesteps(t_video, t_audio, dev_layout)
            rows = video if held is None else torch.cat([held, video], dim=1)  # keyframe rows first (video_indices)
            v_video, v_audio = dit(
                rows, audio, None, timestep, timestep_indices, dev_layout.token_tags, dev_layout.position_ids,
                dev_layout.video_indices, dev_layout.audio_indices, dev_layout.text_indices,
                vsa_plan=plan, refined_text=refined,
            )
            video, audio = self.ladder.step(k, video, v_video[:, c:], audio, v_audio)  # only generated rows move
            progress("denoise", k + 1, total)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        timings["denoise"] = time.perf_counter() - t0
        return DenoisedClip(req, geo, layout, video, audio, timings)

    def _condition(self, req: RenderRequest, geo: RequestGeometry, generator: torch.Generator):
        """fl2va's / ref2va's text features, layout and anchor rows (worker/h3/conditioning.py has the data flow)."""
        from h3batch.worker.h3 import conditioning
        from h3batch.worker.h3.text_encoder import encode_presentation

        if req.task == "fl2va":
            keyframes = conditioning.place_keyframes(req.first_frame, req.last_frame, geo.width, geo.height)
            images = keyframes.images
        else:  # ref2va
            images = conditioning.place_references(req.references, self.info.native.reference_short_edge)
        prompt_ids = self.text_encoder.tokenize(req.prompt)
        shown = conditioning.presentation(self.text_encoder.tokenizer, self.vision.image_processor, prompt_ids,
                                          images, text_tag=packing.TEXT_TAG, video_tag=packing.VIDEO_TAG)
        features = encode_presentation(self.text_encoder, shown.token_ids, shown.mm_token_type_ids,
                                       shown.vision_inputs)
        anchors = [conditioning.encode_condition(self.vision.video_encoder, image) for image in images]
        if req.task == "fl2va":
            layout = packing.build_packed_layout(len(shown.token_ids), geo, text_tags=shown.token_tags,
                                                 keyframe_anchors=keyframes.anchors)
        else:
            layout = packing.build_reference_layout(shown.token_tags, geo,
                                                    tuple(tuple(a.shape[-2:]) for a in anchors))
        rows = [packing.patchify_video(conditioning.noised_condition(anchor, generator)) for anchor in anchors]
        return features, layout, rows

    @torch.inference_mode()
    def write(self, clip: DenoisedClip, out_path: str | Path, *, on_progress: ProgressFn | None = None,
              should_cancel: Callable[[], bool] | None = None) -> RenderResult:
        """Stages decode and mux: latents to the MP4 at `out_path` (atomic). Checks `should_cancel` before each."""
        req, geo, layout, video, audio = clip.request, clip.geometry, clip.layout, clip.video, clip.audio
        progress = on_progress or (lambda stage, step, total: None)
        timings = dict(clip.timings)
        boundary = _stop_check(should_cancel, timings)

        # 3. Decode both modalities with the diffusers VAEs; 4. mux into the MP4 (temp file + rename).
        boundary()
        progress("decode", 0, 0)
        t0 = time.perf_counter()
        options = self.write_options
        latents = packing.unpatchify_video(video, geo.latent_frames, geo.latent_height, geo.latent_width)
        waveform = decode.decode_audio(self.audio_vae, audio[0])  # fp32 [2, 800A]
        metadata = {
            "comment": f"h3batch seed={req.seed}",
            "h3batch_release": self.release_id,
            "h3batch_contract_sha256": self.contract_hash,
            "h3batch_seed": str(req.seed),
            **provenance_tags(self.provenance),
        }

        def tags() -> dict[str, str]:
            stages = ",".join(f"{k}={v:.4f}" for k, v in timings.items())  # stages before mux
            return {**metadata, "h3batch_stage_seconds": stages, **dict(req.metadata)}

        if options.tile_batch is None:  # legacy: decode the whole clip, then encode it
            frames = decode.decode_video(self.video_vae, latents)  # uint8 [N, H, W, 3]
            timings["decode"] = time.perf_counter() - t0
            boundary()
            progress("mux", 0, 0)
            t0 = time.perf_counter()
            path = mp4.write_mp4(out_path, frames, waveform, metadata=tags(), preset=options.preset)
            timings["mux"] = time.perf_counter() - t0
            num_frames = int(frames.shape[0])
        else:  # streaming: each decoded chunk goes to the encoder while the next one decodes
            with mp4.Mp4Writer(out_path, geo.width, geo.height, waveform, preset=options.preset,
                               background=options.stream_mux) as writer:
                for frames in decode.iter_video_frames(self.video_vae, latents, tile_batch=options.tile_batch):
                    writer.add_frames(frames)  # BT.709 conversion on the frames' device, encode on the thread
                timings["decode"] = time.perf_counter() - t0
                boundary()  # a cancel here leaves the block: the writer aborts, nothing is written
                progress("mux", 0, 0)
                t0 = time.perf_counter()
                path = writer.finish(metadata=tags())
                timings["mux"] = time.perf_counter() - t0
                num_frames = writer.frames_written

        return RenderResult(
            path=Path(path), seed=req.seed, timings=timings,
            tokens={"text": layout.text_rows, "audio_rows": layout.audio_rows, "video_rows": layout.video_rows,
                    "sequence": layout.sequence_length},
            frames=num_frames, width=geo.width, height=geo.height, seconds=geo.num_frames / 24,
        )
