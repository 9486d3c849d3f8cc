"""What `VLLMServer` reads back from a vLLM server without starting one: the KV pool its latest
start logged, and a metric summed over labels from /metrics text (the vllm lane reads both from a
real server: tests/engine/test_engine_vllm_paging.py)."""

from __future__ import annotations

import sys

from posttrain.configs.engine import VLLMConfig
from posttrain.engine.vllm import VLLMServer, prometheus_sum

METRICS = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="base"} 13.0
vllm:num_preemptions_total{engine="1",model_name="base"} 2.0
vllm:num_preemptions_created{engine="0",model_name="base"} 1.7964009550961077e+09
vllm:request_num_preemptions_sum{engine="0",model_name="base"} 13.0
vllm:num_requests_waiting 3.0
"""


def test_prometheus_sum_adds_one_metrics_samples_only():
    assert prometheus_sum(METRICS, "vllm:num_preemptions_total") == 15.0  # both engines, not _created
    assert prometheus_sum(METRICS, "vllm:num_requests_waiting") == 3.0  # a sample without labels
    assert prometheus_sum(METRICS, "vllm:num_preemptions") == 0.0  # a prefix of other names is none
    assert prometheus_sum("", "vllm:num_preemptions_total") == 0.0


def test_kv_cache_tokens_is_the_latest_starts(tmp_path):
    server = VLLMServer(tmp_path / "model", tmp_path, VLLMConfig(python=sys.executable))
    assert server.kv_cache_tokens() is None  # no log yet
    server.dir.mkdir()
    line = "(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: {} tokens, Maximum concurrency"
    server.log_path.write_text(f"\n=== start 1: x ===\n{line.format('524,288')}\n")
    assert server.kv_cache_tokens() == 524_288
    with server.log_path.open("a") as log:
        log.write("\n=== start 2: x ===\n(APIServer pid=2) INFO starting\n")
    assert server.kv_cache_tokens() is None  # the restarted server has not allocated its pool yet
    with server.log_path.open("a") as log:
        log.write(line.format("640") + "\n")
    assert server.kv_cache_tokens() == 640
