import cProfile, pstats, sys, time
import sim
from sim.paths import shared_data_root
root = shared_data_root()
kind = sys.argv[1]
if kind == "replay":
    cluster = sim.load_cluster(root / "validation/RTX4090-Llama-3.1-8B/cluster.json").with_mem_util(0.9)
    wl = sim.load_jsonl(root / "workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl")
else:
    cluster = sim.parse_cluster({"num_nodes": 1, "link_bw": 16, "link_latency": 1000, "nodes": [{
        "num_instances": 1, "cpu_mem": {"mem_size": 64, "mem_bw": 50, "mem_latency": 0},
        "instances": [{"model_name": "meta-llama/Llama-3.1-8B", "hardware": "RTX4090",
                       "npu_mem": {"mem_size": 24, "mem_bw": 1008, "mem_latency": 0,
                                   "mem_util": 0.9}, "num_npus": 1, "tp_size": 1}]}]})
    wl = sim.generate(sim.WorkloadSpec(num_requests=10000, arrival="poisson", rate=2.0,
                                       input=sim.LengthDist("uniform", low=64, high=1024),
                                       output=sim.LengthDist("uniform", low=32, high=512), seed=1))
opts = sim.SimOptions(max_num_seqs=256, max_num_batched_tokens=2048)
for i in range(2):
    s = sim.Simulator(cluster, opts); t=time.perf_counter(); r = s.run(wl); print("wall", time.perf_counter()-t)
s = sim.Simulator(cluster, opts)
pr = cProfile.Profile(); pr.enable(); r = s.run(wl); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(30)
