"""h3batch.client: the h3batch API from Python (docs/client.md).

    from h3batch.client import Client
    with Client("http://127.0.0.1:8000", api_key="...") as client:
        job = client.run("rain on a tin roof", "rain.mp4", seconds=4)

`Client` (blocking) and `AsyncClient` (asyncio) over httpx2; typed models of jobs, events, batches and errors
(client/models.py); one exception per error code (client/errors.py); the `h3batch submit` command is built on
`Client` (client/cli.py, client/cli_batch.py). This room imports httpx2, pydantic and the two pure helpers it shares
with the server (core/jsonl.py, core/archive_names.py), never Flask, Redis or the model stack.
"""
from h3batch.client.aio import AsyncClient
from h3batch.client.errors import *  # noqa: F403  (every exception class, one per code)
from h3batch.client.errors import APIError, H3BatchError, JobFailed
from h3batch.client.models import (Batch, BatchCounts, BatchPage, BatchResult, ErrorInfo, Job, JobEvent, JobPage,
                                   JobStatus, Usage, UsageDay, UsageJobs)
from h3batch.client.protocol import BatchFileError, RetryPolicy
from h3batch.client.sync import Client

__all__ = ["APIError", "AsyncClient", "Batch", "BatchCounts", "BatchFileError", "BatchPage", "BatchResult", "Client",
           "ErrorInfo", "H3BatchError", "Job", "JobEvent", "JobFailed", "JobPage", "JobStatus", "RetryPolicy", "Usage",
           "UsageDay", "UsageJobs"]
