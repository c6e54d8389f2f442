"""CUDA-graph capture that bench.py (and the scripts that import it) and baselines.py share; torch only, so
baselines.py still runs without cupy."""

import torch


def capture(call, sets, reps):
    """Captures `reps` calls rotating over `sets` input sets into a CUDA graph, replays it once and returns it."""
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=s):
        for r in range(reps):
            call(r % sets)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    return graph
