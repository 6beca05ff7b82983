"""Under pytest-xdist (`pytest -n N`), each worker computes on its share of the cores, it and the processes its tests
start (the CLIs, the DDP pairs): with torch's default of a thread per core in every worker, N workers run N × cores
OpenMP threads on the cores, which spin against each other. On this project's 2-core CI machine, three test files
took 148 s on two workers of two threads each and 45 s on two workers of one thread each."""

import os

import torch

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # not on macOS
    THREADS = max(1, CORES // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(THREADS)
    torch.set_num_threads(THREADS)
