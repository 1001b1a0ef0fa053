# h3batch load-runner image: duplex driver, reference duplex server, sweep worker, beat and Flower. No torch: the sweep
# stack needs only websockets, numpy, matplotlib (Agg) and the Celery/Redis client.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 MPLBACKEND=Agg
WORKDIR /app

RUN pip install "celery[redis]>=5.5,<6" "redis>=5" "websockets>=15" "numpy>=2.0" "matplotlib>=3.9" \
        "flask>=3.1" "pydantic>=2.10" "flower>=2.0"

# setuptools packages every listed package, so all four directories are copied; only loadrunner/ and the CLI
# router run here.
COPY pyproject.toml README.md ./
COPY h3batch ./h3batch
COPY core ./core
COPY api ./api
COPY worker ./worker
COPY kernels ./kernels
COPY loadrunner ./loadrunner
RUN pip install --no-deps . \
    && python -c "import sys, h3batch.loadrunner.sweep_tasks, h3batch.loadrunner.server, h3batch.loadrunner.beat, h3batch.loadrunner.duplex; \
assert 'torch' not in sys.modules, 'the load-runner image must not import torch'"

# Same uid as the API image, so both can write the shared `artifacts` volume (sweeps live in /artifacts/sweeps).
RUN useradd --uid 10001 --no-create-home h3batch && mkdir -p /artifacts/sweeps && chown -R h3batch /artifacts
USER h3batch
CMD ["h3batch", "sweep-worker"]
