"""`python -P -m h3batch.api.gunicorn_app [gunicorn options] APP`: gunicorn's own command line, minus one habit.

gunicorn puts its working directory (`--chdir`, by default the current one) first on `sys.path` before it loads the
worker class and the app. Started in a checkout, that made the checkout's top-level folders (`kernels/`, `core/`,
...) importable under their bare names, shadowing installed distributions, which is what Python's safe-path mode
(`-P`, used for every process h3batch starts) is there to prevent. gunicorn has no option to skip it, so this
subclass changes directory and leaves `sys.path` alone; everything else is gunicorn's `WSGIApplication`.
"""
from __future__ import annotations

import os

from gunicorn.app.wsgiapp import WSGIApplication


class SafePathApplication(WSGIApplication):
    def chdir(self) -> None:
        os.chdir(self.cfg.chdir)


def main() -> None:
    SafePathApplication("%(prog)s [OPTIONS] [APP_MODULE]", prog="h3batch api").run()


if __name__ == "__main__":
    main()
