"""dse: search the LLM-serving design space with Optuna, Ray and MLflow over ``sim``.

``dse search SPACE.yaml --out DIR`` runs (or resumes) a study: Optuna proposes knob values
(NSGA-II by default for several objectives, SLOs as normalised constraints), a pool of
long-lived Ray actors simulates each configuration with ``sim.simulate``, and the driver,
the only writer, tells Optuna (journal file ``DIR/study.journal``) and logs one MLflow
child run per trial under one parent run (``sqlite:///DIR/mlflow.db`` by default). Results:
``trials.csv``, ``pareto.csv`` (feasible non-dominated trials), ``report.html`` and
``best/`` (cluster JSON + ``vllm serve`` command per Pareto configuration).

Space file fields (see ``search_spaces/quickstart.yaml``): ``model``, ``hardware`` (a name
or a list), ``budget`` {total_devices, devices_per_node, price_per_device_hour},
``cluster`` {link_bw, link_latency, cpu_mem, mem_util, npu_mem_size, npu_mem_bw} (link_bw /
link_latency as a cluster file reads them, sim/topology.py: the GPU-to-GPU path, ASTRA-Sim's
2^30 B/s, ns per message; left out, the hardware catalogue's physical link),
``workload`` {file, limit} or {generate: sim workload spec}, ``slo`` {p50|p90|p95|p99|mean
_ ttft|tpot|itl|e2e _ms, attainment {target, ttft_ms, tpot_ms, e2e_ms}}, ``objectives``,
``knobs`` (value, list, {values}, or {low, high, step, log}), ``simulator``
{latency_provider, backend, seed}, ``capacity`` {enabled, start_rate, max_rate, tolerance,
max_probes}, ``search`` {sampler, n_trials, timeout_s, seed, workers, population_size,
trial_timeout_s}.
"""

from dse.space import Space, load_space, parse_space
from dse.study import Driver, run_search

__all__ = ["Driver", "Space", "load_space", "parse_space", "run_search"]
