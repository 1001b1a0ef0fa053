"""Visual conditioning of the native MiniMax-H3 release: fl2va keyframes and ref2va reference images.

Data flow of one fl2va request (docs/model.md "Keyframes and references"; diffusers 0.42.1's
`modular_pipelines/minimax_h3` is the oracle, tests/worker/h3/native/ check it bit for bit):

    first / last keyframe (RGB) ──`place_keyframes`──▶ canvas-sized images (first stretched, last cover-cropped)
        ├──Qwen3-VL image processor──▶ pixel patches + grid ──`presentation`──▶ "<Picture i>: " + vision block per
        │      keyframe, then the prompt (no chat template); vision rows tagged *video* ──▶ text encoder (with vision)
        └──video VAE encoder (ImageNet-normalised uint8, posterior sampled under seed 42, fp16-rounded, normalised by
               latents_mean/std) ──▶ one [1, 24, 1, Hl, Wl] anchor per keyframe ──`noised_condition_rows`──▶ held at
               t = 0.999 (a draw from the request's generator per keyframe, before the target noise), packed in front
               of the generated video rows

ref2va (image references; diffusers' video and audio references are not served) differs in three places: each
reference is scaled to its own size (`place_references`: a short edge of 2048 in the published release, not the
canvas), its anchor rows get their own latent grid and one rotary slot each before the generated rows
(packing.build_reference_layout), and the DiT is the `transformer_ref/` partition. The presentation
("<Picture i>: " + vision block per image, then the prompt) and the anchor encoding are fl2va's.

Written here rather than run as diffusers' blocks: those blocks own their pipeline state and components (the
`ModularPipeline` machinery), while h3batch renders with its own DiT, text encoder and streaming decode; the steps
below are short and call the libraries for everything but the arithmetic the released model defines (PIL's LANCZOS
resize, transformers' Qwen2-VL image processor, diffusers' VAE encode and posterior sample).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

KEYFRAME_ENCODE_SEED = 42
"""Seed the keyframe posterior is sampled under, independent of the request (diffusers' `keyframe_encode_seed`)."""
KEYFRAME_NOISE_AUG = 0.999
"""Clean time a conditioning anchor is held at for every step (diffusers' `keyframe_noise_aug`)."""
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)
"""ImageNet normalisation of the video VAE's input."""
ANCHORS = ("first", "last")
MAX_REFERENCES = 9
"""ref2va: at most 9 image references per request (diffusers' limit for images)."""
CANVAS_MULTIPLE = 32


@dataclass(frozen=True)
class Keyframes:
    """The keyframes of one fl2va request on its canvas, in packed order, with the end each one anchors."""

    images: tuple[Image.Image, ...]
    anchors: tuple[str, ...]


def open_image(source) -> Image.Image:
    """An RGB PIL image from a PIL image or a file path (ValueError naming the file when it is not an image)."""
    if isinstance(source, Image.Image):
        return source.convert("RGB")
    try:
        with Image.open(Path(source)) as image:
            return image.convert("RGB")
    except (OSError, ValueError) as err:
        raise ValueError(f"image {source}: expected a readable image file, found {type(err).__name__}: {err}") from err


def place_keyframes(first, last, width: int, height: int) -> Keyframes:
    """Put the keyframes onto the `width` x `height` canvas by the released model's rule (docs/api.md "Images"):
    the first keyframe given (the geometry anchor) is stretched onto the canvas with LANCZOS; when both are given the
    last one is scaled to cover the canvas (rounded sizes, LANCZOS) and centre-cropped at ((w' - w) // 2,
    (h' - h) // 2). An image already at the canvas size is used as is."""
    given = [(anchor, open_image(image)) for anchor, image in zip(ANCHORS, (first, last)) if image is not None]
    if not given:
        raise ValueError("fl2va: expected a first keyframe, a last keyframe or both, found neither")
    placed = []
    for index, (_, image) in enumerate(given):
        if image.size == (width, height):
            placed.append(image)
        elif index == 0:
            placed.append(image.resize((width, height), Image.Resampling.LANCZOS))
        else:
            scale = max(width / image.size[0], height / image.size[1])
            size = (max(width, round(image.size[0] * scale)), max(height, round(image.size[1] * scale)))
            left, top = max(0, (size[0] - width) // 2), max(0, (size[1] - height) // 2)
            placed.append(image.resize(size, Image.Resampling.LANCZOS).crop((left, top, left + width, top + height)))
    return Keyframes(tuple(placed), tuple(anchor for anchor, _ in given))


@dataclass(frozen=True)
class Presentation:
    """What the text encoder reads for one request: token ids, the DiT modality tag of each token row, the
    Qwen-internal modality ids (0 text, 1 image) and the vision inputs by the encoder's own argument names."""

    token_ids: list[int]
    token_tags: list[int]
    mm_token_type_ids: list[int]
    vision_inputs: dict[str, torch.Tensor]


def presentation(tokenizer, image_processor, prompt_ids: list[int], images: tuple[Image.Image, ...],
                 *, text_tag: int, video_tag: int) -> Presentation:
    """The fl2va presentation: per image a `"<Picture i>: "` label (text rows) and a vision block
    `<|vision_start|> <|image_pad|> x n <|vision_end|>` (rows tagged video for the DiT), then the prompt verbatim;
    no chat template and no special tokens. n = image patches / merge_size^2 from the image processor's grid."""
    token_ids: list[int] = []
    tags: list[int] = []
    vision_inputs: dict[str, torch.Tensor] = {}
    if images:
        vision = image_processor(images=list(images), return_tensors="pt")
        grid = vision["image_grid_thw"]
        vision_inputs = {"pixel_values": vision["pixel_values"], "image_grid_thw": grid}
        merge = image_processor.merge_size ** 2
        start, pad, end = (tokenizer.convert_tokens_to_ids(t)
                           for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))
        for index in range(len(images)):
            label = tokenizer(f"<Picture {index + 1}>: ", add_special_tokens=False)["input_ids"]
            block = [start] + [pad] * (int(grid[index].prod()) // merge) + [end]
            token_ids += label + block
            tags += [text_tag] * len(label) + [video_tag] * len(block)
    token_ids += prompt_ids
    tags += [text_tag] * len(prompt_ids)
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    mm_types = [1 if token == image_pad else 0 for token in token_ids]
    return Presentation(token_ids, tags, mm_types, vision_inputs)


@torch.inference_mode()
def encode_condition(vae, image: Image.Image) -> torch.Tensor:
    """One keyframe through the video VAE's encoder: fp32 CPU [1, 24, 1, Hl, Wl] normalised conditioning latents.

    uint8 pixels / 255, ImageNet-normalised, encoded by the spatial encoder (one frame: no temporal chunking), the
    posterior *sampled* under a fresh generator seeded `KEYFRAME_ENCODE_SEED`, rounded to fp16, then normalised by
    the VAE's `latents_mean` / `latents_std` (what the released model was trained on)."""
    device = next(vae.parameters()).device
    pixels = torch.from_numpy(np.array(image)).to(device).permute(2, 0, 1)[None, :, None]  # uint8 [1, 3, 1, H, W]
    mean = torch.tensor(PIXEL_MEAN, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(PIXEL_STD, device=device).view(1, -1, 1, 1, 1)
    pixels = (pixels.to(torch.float32).div(255.0) - mean) / std
    posterior = vae.encode(pixels.to(next(vae.parameters()).dtype), return_dict=False)[0]
    latents = posterior.sample(generator=torch.Generator().manual_seed(KEYFRAME_ENCODE_SEED))
    latents = latents.to(torch.float16).float().cpu()
    latents_mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    latents_std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return (latents - latents_mean) / latents_std


def noised_condition(condition: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """x = t·c + (1 − t)·ε at t = `KEYFRAME_NOISE_AUG` in fp32, ε one draw of c's shape from the request's generator
    (drawn before the target noise: the order is part of what a seed reproduces)."""
    noise = torch.randn(condition.shape, generator=generator, dtype=torch.float32)
    t = torch.tensor(KEYFRAME_NOISE_AUG, dtype=torch.float32)
    return t * condition.to(torch.float32) + (1.0 - t) * noise


def place_references(images, short_edge: int) -> tuple[Image.Image, ...]:
    """ref2va's rule for reference images (docs/api.md "Images"): each is scaled so its short edge is `short_edge`
    (up or down, no area cap; the generated canvas does not bind it), both sides rounded to the nearest multiple of 32
    (at least 32), resized with LANCZOS. ValueError naming `references[i]` for more than `MAX_REFERENCES` images or an
    aspect ratio outside 1:4 .. 4:1."""
    if not images:
        raise ValueError("references: ref2va needs at least one reference image, found none")
    if len(images) > MAX_REFERENCES:
        raise ValueError(f"references: expected at most {MAX_REFERENCES} images, found {len(images)}")
    placed = []
    for index, source in enumerate(images):
        image = open_image(source)
        width, height = image.size
        if width > 4 * height or height > 4 * width:
            raise ValueError(f"references[{index}]: expected an aspect ratio within 1:4 and 4:1, found {width}x{height}")
        scale = short_edge / min(width, height)
        size = (max(CANVAS_MULTIPLE, round(width * scale / CANVAS_MULTIPLE) * CANVAS_MULTIPLE),
                max(CANVAS_MULTIPLE, round(height * scale / CANVAS_MULTIPLE) * CANVAS_MULTIPLE))
        placed.append(image if image.size == size else image.resize(size, Image.Resampling.LANCZOS))
    return tuple(placed)
