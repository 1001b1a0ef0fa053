"""The browser UI: `/` (submit a prompt, live progress from the job's event stream, gallery of finished clips),
`/ui/batches` (upload a JSONL file as one batch, its progress and per-item status, the archive link) and
`/ui/sweeps` (load-runner sweeps and their plots). Server-rendered Jinja templates (api/templates) plus one vanilla
JavaScript file (api/static/app.js); no build step.

The pages themselves hold no data, so they are served without a key; every data call the script makes goes to the
JSON API with `Authorization: Bearer <key>` when a key is stored (the page asks for one after a 401 and keeps it in
localStorage). The event stream is read with `fetch()` streaming rather than `EventSource`, because EventSource
cannot send headers and a key in the query string would end up in access logs; videos and plots are fetched the
same way and shown from blob URLs.
"""
from __future__ import annotations

from flask import Blueprint, current_app, render_template

from h3batch.core import defaults, geometry

bp = Blueprint("web", __name__)

OPEN_PATHS = frozenset({"/", "/ui/batches", "/ui/sweeps"})
"""Page routes served without a key (static files under /static/ are open too)."""
OPEN_PREFIXES = ("/static/",)

SIZES = ("256x128", "128x256", "256x256", "512x256", "768x384", "1344x768", "768x1344")
"""Canvas choices offered by the form (any multiple of 32 with aspect 1:4..4:1 is accepted by the API)."""


@bp.get("/")
def index():
    """Submit form, live progress and the gallery."""
    return render_template("index.html", sizes=SIZES, default_size=f"{defaults.DEFAULT_WIDTH}x{defaults.DEFAULT_HEIGHT}",
                           default_seconds=defaults.DEFAULT_SECONDS,
                           min_seconds=geometry.MIN_REQUESTED_FRAMES // geometry.FPS,
                           max_seconds=geometry.MAX_REQUESTED_FRAMES // geometry.FPS)


@bp.get("/ui/batches")
def batches_page():
    """Upload a JSONL file as a batch; its progress, per-item status and the archive link."""
    return render_template("batches.html", max_batch=current_app.config["MAX_BATCH"])  # the value, not its name


@bp.get("/ui/sweeps")
def sweeps_page():
    """Load-runner sweeps with their plots."""
    return render_template("sweeps.html")
