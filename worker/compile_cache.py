"""H3BATCH_COMPILE_CACHE: one persistent directory for the TorchInductor and Triton on-disk compile caches.

Both libraries cache compiled kernels on disk by default, but under per-user temp directories
(`/tmp/torchinductor_<user>`, `~/.triton/cache`) that a container loses on restart, so every worker start recompiled
FlexAttention, the decoder's ViT blocks and the Triton ops (issue 25: 26 s warm-up on a fresh machine). With the
setting, both point into a directory that compose and the K8s manifest mount as a volume
(`<dir>/inductor`, `<dir>/triton`), so a restarted worker loads compiled kernels instead of compiling them.

Set before the first compile (the worker calls `configure` before it loads the pipeline); both libraries read these
variables when they look a cache up, and a rank group's spawned processes inherit them. torch-free.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("h3batch.worker")

INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"


def configure(directory: Path | str | None, environ: dict | None = None) -> dict[str, str]:
    """Point the Inductor and Triton caches under `directory` (created) in `environ` (default os.environ); None
    leaves them as they are. Returns the variables set. Raises ValueError naming H3BATCH_COMPILE_CACHE when the
    directory cannot be created or written."""
    if directory is None:
        return {}
    env = os.environ if environ is None else environ
    root = Path(directory)
    values = {INDUCTOR_ENV: str(root / "inductor"), TRITON_ENV: str(root / "triton")}
    try:
        for path in values.values():
            Path(path).mkdir(parents=True, exist_ok=True)
            if not os.access(path, os.W_OK):
                raise PermissionError(f"{path} is not writable")
    except OSError as exc:
        raise ValueError(f"H3BATCH_COMPILE_CACHE: cannot use {str(root)!r} as the compile cache: {exc}") from None
    env.update(values)
    log.info("compile cache %s (inductor and triton)", root)
    return values
