"""Model-room tests run on two CPU threads: the machine is shared, and rank processes use one thread each."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _two_threads():
    """Keep each test on the 2 shared CPU cores and deterministic."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)
