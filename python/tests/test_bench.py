"""python -m braid.bench draws the routing braid-bench --moe draws for the same seed, so the two time the same
calls. The expected values are tools/braid-bench/moe_data.cpp's make_routing for seed 1 at T = 4, K = 3, E = 16."""
from braid.bench import bench_routing

RANK_0_IDS = [1, 7, 0, 10, 1, 8, 3, 13, 9, 4, 9, 13]
RANK_0_WEIGHTS = [0.7275390625, 0.970703125, 0.2998046875, 0.7138671875, 0.4189453125, 0.3154296875, 0.958984375,
                  0.986328125, 0.240234375, 0.0322265625, 0.9970703125, 0.50390625]
RANK_1_IDS = [9, 1, 10, 10, 3, 5, 0, 6, 2, 13, 12, 10]


def test_routing_is_braid_bench_s():
    ids, weights = bench_routing(1, 0, 4, 3, 16)
    assert ids == RANK_0_IDS and weights == RANK_0_WEIGHTS
    assert bench_routing(1, 1, 4, 3, 16)[0] == RANK_1_IDS


def test_routing_has_distinct_experts_and_weights_in_range():
    ids, weights = bench_routing(12345, 3, 64, 8, 64)
    for t in range(64):
        assert len(set(ids[t * 8:(t + 1) * 8])) == 8
    assert all(0 <= e < 64 for e in ids) and all(0 < w <= 1 for w in weights)
    assert bench_routing(12345, 3, 64, 8, 64) == (ids, weights)
    assert bench_routing(12346, 3, 64, 8, 64)[0] != ids
