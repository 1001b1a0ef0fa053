# h3batch API image: Flask + gunicorn + Celery client only. No torch (the API never imports it), so it stays small.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY docker/requirements-api.txt /tmp/requirements-api.txt
RUN pip install -r /tmp/requirements-api.txt

# The project's code without its model dependencies (--no-deps): api/ imports only h3batch.core and h3batch.settings
# and the pure-Python geometry rules.
COPY pyproject.toml README.md ./
COPY h3batch ./h3batch
COPY core ./core
COPY api ./api
COPY worker ./worker
COPY kernels ./kernels
COPY loadrunner ./loadrunner
RUN pip install --no-deps . \
    && python -c "import sys, h3batch.api; h3batch.api.create_app(); assert 'torch' not in sys.modules"

RUN useradd --uid 10001 --no-create-home h3batch && mkdir -p /artifacts && chown h3batch /artifacts
USER h3batch
EXPOSE 8000
# gunicorn (gthread) via `h3batch api`, which first checks Redis and the artifacts dir (exit 2, one line).
CMD ["h3batch", "api", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
