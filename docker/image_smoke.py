"""An image's last build step, and `make test`'s fresh-venv check of the same lists
(tests/h3batch/test_image_requirements.py): every module of the rooms the image runs imports, its other distributions'
requirements are met (`pip check`), and the light images load no model stack.

    python docker/image_smoke.py api|loadrunner|worker

Exit 0, or 1 with one line naming the module or package that failed.
"""
from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

ROOMS = {
    "api": ("h3batch.core", "h3batch.api"),
    "loadrunner": ("h3batch.core", "h3batch.loadrunner"),
    "worker": ("h3batch.core", "h3batch.worker", "h3batch.kernels"),
}
"""Packages whose every module must import in the image (imports inside functions run later, so the lists' static
coverage of those is checked by tests/h3batch/test_image_requirements.py)."""

EXTRA = {
    "api": ("h3batch.cli", "h3batch.settings", "botocore", "boto3"),
    "loadrunner": ("h3batch.cli", "h3batch.settings", "flower.command", "matplotlib.pyplot"),
    "worker": ("h3batch.cli", "h3batch.settings", "torch", "diffusers", "transformers", "av", "boto3"),
}
"""Modules the image's commands load beyond its rooms: the S3 artifact store's client (imported when
H3BATCH_ARTIFACT_STORE=s3://...), Flower (`celery flower`), the sweep plots."""

NO_MODEL_STACK = ("torch", "triton", "diffusers", "transformers")


def modules(package: str) -> list[str]:
    root = importlib.import_module(package)
    found = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        found.append(info.name)
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ROOMS:
        print(f"usage: image_smoke.py {{{'|'.join(ROOMS)}}}", file=sys.stderr)
        return 2
    image = argv[0]
    for name in [m for package in ROOMS[image] for m in modules(package)] + list(EXTRA[image]):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the one line names whatever broke the import
            print(f"image {image}: import {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    if image == "api":
        importlib.import_module("h3batch.api").create_app({"TESTING": True})
    if image != "worker":
        loaded = sorted(n for n in NO_MODEL_STACK if n in sys.modules)
        if loaded:
            print(f"image {image}: loads the model stack ({', '.join(loaded)})", file=sys.stderr)
            return 1
    # h3batch's own metadata names the whole stack (one pyproject): an image installs it --no-deps with its subset,
    # so only the other distributions' requirements are checked.
    check = subprocess.run([sys.executable, "-P", "-m", "pip", "check"], capture_output=True, text=True)
    broken = [line for line in check.stdout.splitlines()
              if check.returncode != 0 and line and not line.startswith(("h3batch ", "No broken requirements"))]
    if broken:
        print(f"image {image}: pip check: {' / '.join(broken[:3])}", file=sys.stderr)
        return 1
    print(f"image {image}: {sum(1 for _ in sys.modules)} modules loaded, pip check clean")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
