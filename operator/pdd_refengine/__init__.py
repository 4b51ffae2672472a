"""The reference engine: a TEST DOUBLE of an inference engine (vLLM or SGLang), nothing more.

It has no model and does no GPU math. It stands in for the engine container so that ``make
test`` and ``make demo`` can run a PDDeployment end to end without GPUs: it takes the command
lines the operator renders for vLLM (``vllm serve ...``) and SGLang (``python3 -m
sglang.launch_server ...``), answers the HTTP API the upstream routers drive, and moves real
KV-sized bytes from prefill to decode with NIXL. Everything around it is real: vllm-router and
smg, the pdd sidecar that carries the NIXL agent metadata, NIXL/UCX themselves, the operator
and the Kubernetes control plane.

What "KV" means here: each request's prompt is cut into tokens (4 UTF-8 bytes each, or the
token ids given), the prefill fills one KV-cache-sized slot per token with a pattern computed
from the prompt (``pattern.py``), NIXL moves it, and the decode recomputes the pattern and
checks every byte before it answers with tokens derived from a hash of the prompt.

Modules: ``cli`` (both engines' command lines), ``layout`` (bytes per token), ``pattern``
(the fill and the check), ``kv_params`` (vLLM's ``kv_transfer_params``), ``kvcache`` (the
registered region and NIXL), ``openai_api`` (request and response shapes), ``metrics``,
``vllm_flow`` / ``vllm_push`` / ``sglang_flow`` (the P/D protocols; SGLang's bootstrap exchange
in ``sglang_exchange`` (HTTP fields), ``sglang_frames`` (ZMQ frames), ``sglang_bootstrap`` (the
bootstrap server) and ``sglang_ranks`` (the ZMQ sockets)), ``server`` (the HTTP app).
"""
