"""Runs a test over several CPU processes (gloo): each rank calls ``target(rank, rendezvous,
failures, *args)``, with ``rendezvous`` a file for ``init_process_group(init_method="file://...")``
and ``failures`` a queue that gets one line per rank that failed; the parent asserts that every
process exited cleanly and none reported a failure."""

import os
import tempfile

import torch.multiprocessing as mp


def run_ranks(target, world, *args, timeout=300):
    ctx = mp.get_context("spawn")
    failures = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        rendezvous = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=target, args=(r, rendezvous, failures, *args)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=timeout)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    found = []
    while not failures.empty():
        found.append(failures.get())
    assert not found, "\n".join(found)
