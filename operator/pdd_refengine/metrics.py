"""Prometheus metrics in the engine's own names, plus the reference engine's KV counters.

vLLM mode uses vLLM's names (``vllm:num_requests_running`` ...). SGLang mode uses SGLang's
(``sglang:num_running_reqs`` ...) and nothing containing ``vllm``: smg decides whether a worker
is vLLM by looking for ``vllm:``/``vllm_`` in its /metrics text, and only for an SGLang worker
does it use the bootstrap protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# engine -> (running, waiting, kv usage, prompt tokens, generation tokens, successes)
_NAMES = {
    "vllm": (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
    ),
    "sglang": (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:prompt_tokens",
        "sglang:generation_tokens",
        "sglang:num_requests",
    ),
}
# engine -> (time to first token, inter-token latency): the names the dashboards chart
# (tests/fixtures/metrics pins them for each engine version).
_LATENCY_NAMES = {
    "vllm": ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"),
    "sglang": ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"),
}
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5)
_TRANSFER_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass
class EngineMetrics:
    registry: CollectorRegistry
    running: Gauge
    waiting: Gauge
    kv_usage: Gauge
    prompt_tokens: Counter
    generation_tokens: Counter
    successes: Counter
    kv_bytes_verified: Counter
    kv_bytes_sent: Counter
    kv_transfer_seconds: Histogram
    kv_verify_failures: Counter
    lora_requests: Counter  # by adapter name (labels: adapter)
    time_to_first_token: Histogram
    inter_token_latency: Histogram
    # vLLM only (SGLang's /metrics must name nothing vllm): prompt tokens looked up in the
    # prefix cache, and those found there (kv_events.PrefixStore).
    prefix_cache_queries: Counter | None = None
    prefix_cache_hits: Counter | None = None


def engine_metrics(engine: str, model_name: str) -> EngineMetrics:
    registry = CollectorRegistry()
    running, waiting, usage, prompt, generation, success = _NAMES[engine]
    ttft, itl = _LATENCY_NAMES[engine]
    label = {"model_name": model_name}

    def gauge(name: str, text: str) -> Gauge:
        return Gauge(name, text, list(label), registry=registry).labels(**label)

    def histogram(name: str, text: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, text, list(label), registry=registry, buckets=buckets).labels(
            **label
        )

    def counter(name: str, text: str, labelled: bool = True) -> Counter:
        if not labelled:
            return Counter(name, text, registry=registry)
        return Counter(name, text, list(label), registry=registry).labels(**label)

    vllm = engine == "vllm"
    return EngineMetrics(
        registry=registry,
        running=gauge(running, "Requests being served."),
        waiting=gauge(waiting, "Requests waiting (the reference engine queues none)."),
        kv_usage=gauge(usage, "Fraction of KV blocks in use."),
        prompt_tokens=counter(prompt, "Prompt tokens processed."),
        generation_tokens=counter(generation, "Tokens generated."),
        successes=counter(success, "Requests finished successfully."),
        kv_bytes_verified=counter(
            "pdd_refengine_kv_bytes_verified", "KV bytes received and checked byte for byte.", False
        ),
        lora_requests=Counter(
            "pdd_refengine_lora_requests",
            "Requests served with a LoRA adapter, by its name.",
            ["adapter"],
            registry=registry,
        ),
        kv_bytes_sent=counter(
            "pdd_refengine_kv_bytes_sent", "KV bytes sent or served to peers.", False
        ),
        kv_transfer_seconds=Histogram(
            "pdd_refengine_kv_transfer_seconds",
            "Seconds one request's KV transfer took (NIXL post to completion).",
            registry=registry,
            buckets=_TRANSFER_BUCKETS,
        ),
        time_to_first_token=histogram(
            ttft,
            "Seconds from a request's arrival to its first token (KV handoff included).",
            _TTFT_BUCKETS,
        ),
        inter_token_latency=histogram(
            itl, "Seconds between a request's tokens after the first.", _ITL_BUCKETS
        ),
        kv_verify_failures=counter(
            "pdd_refengine_kv_verify_failures", "Requests whose received KV differed.", False
        ),
        # vLLM's names (tests/fixtures/metrics, 0.11.0 and 0.33.0 alike).
        prefix_cache_queries=counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        if vllm
        else None,
        prefix_cache_hits=counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache."
        )
        if vllm
        else None,
    )
