"""Tests of the kernels room (h3batch.kernels): each op's Triton kernel against its torch reference, on CPU under the
Triton interpreter and on CUDA compiled; shared setup and input builders live in `kernel_cases`."""
