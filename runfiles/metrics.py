"""metrics.json of a training run: a contract the engine writes (parallel.engine.metrics) and the
profiler, the dashboard and the tests read.

metrics.json (rank keys are strings, as JSON requires):

    world_size                      int
    plan, model                     the Plan and Model as JSON
    steps, seed, lr, dropout        the run's settings
    loss                            [float] per optimizer step: the global-batch mean loss
    step_time_s                     [float] per step: the slowest rank's wall time
    step_time_s_per_rank            {rank: [float]}
    comm_time_s_per_rank            {rank: [float]} per step: the seconds the rank spent inside its
                                    communication calls (the ps.comm ranges, timed whether or not a
                                    profiler records them; their union where several are open at once)
    cpu_time_s_per_rank             {rank: [float]} per step: the CPU seconds of the rank's process (all its
                                    threads, the transport's included); on shared cores, with the wall
                                    times, how much of a step the rank ran and how much it waited for a core
    comm_cpu_time_s_per_rank        {rank: [float]} per step: the part of cpu_time_s inside its
                                    communication calls
    init_s                          {rank: seconds from the rank's start to its first step}
    activation_bytes                {rank: bytes saved for backward by one microbatch on that rank}
    activation_breakdown            {rank: {component: bytes}} memory.py's component names summed
                                    over the rank's layers, plus first_stage_extra / last_stage_extra
    activation_bytes_per_layer      {rank: {layer: bytes}}
    predicted_activation_bytes      {rank: bytes} from parallel.core.memory for the same microbatch
    predicted_activation_breakdown  {rank: {component: bytes}}, keyed like activation_breakdown
    model_state_bytes               {rank: {params, grads, optimizer}}: the bytes of the storages the rank
                                    held for them after the first step's gradient reduction
                                    (parallel.engine.modelstate: each storage once, ZeRO shards included)
    predicted_model_state_bytes     {rank: {params, grads, optimizer}} from parallel.core.memory for the
                                    engine's dtypes
    model_state_transient_bytes     {rank: {gathered_params, unsharded_grads}}: ZeRO-2/3's peaks inside a
                                    step (all-gathered layers; full-size gradients awaiting their
                                    reduce-scatter); {} at ZeRO 0 and 1
    live_microbatches               {rank: {peak, per_chunk, predicted_peak, predicted_first_chunk}}:
                                    the most microbatch-chunks whose activations the rank held at once
                                    (all chunks; per model chunk), and parallel.core.memory's
                                    inflight_chunks / embedding_chunks (first stage only, else null)
    coords                          {rank: {dp, pp, cp, tp}}
    hosts                           {rank: {hostname, node, local_rank}}
    nodes                           number of distinct nodes
    backend, torch_version, launcher

Pure: stdlib only.
"""

from __future__ import annotations

from pathlib import Path

from runfiles.rundir import METRICS_JSON, load_json_object


def load_metrics(run_dir: str | Path) -> dict:
    """A run's metrics.json, read bounded (raises OSError / ValueError when it is missing, too large, not
    JSON or not an object)."""
    return load_json_object(Path(run_dir) / METRICS_JSON)
