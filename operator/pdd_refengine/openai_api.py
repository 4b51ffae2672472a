"""Request and response shapes: OpenAI completions and chat completions (vLLM and SGLang
serve both) and SGLang's native ``/generate``, plus the reference engine's own extension.

The "generation" is a deterministic function of the prompt: token ``i`` of the answer is a
word picked by a hash of the prompt and ``i``, so a test can tell which prompt an answer
belongs to and that ``max_tokens`` was honoured.

Extension: every completion carries a top-level ``pdd_refengine`` object, ``{"prefill": ID,
"decode": ID, "kv_bytes": N, "kv_verified": true|false, "kv_seconds": S, ...}`` (ID: the pod
name from POD_NAME or HOSTNAME, else host:port; S: the NIXL transfer alone), saying which pods
served the request and how much KV moved. Real engines do not send it; the demo prints it. In
a stream it is on the last chunk.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pdd_refengine.pattern import prompt_digest, tokenize

COMPLETIONS = "completions"
CHAT = "chat"
GENERATE = "generate"  # SGLang's native API
DEFAULT_MAX_TOKENS = 16

_VOCABULARY = (
    "the",
    "kv",
    "cache",
    "moved",
    "from",
    "prefill",
    "to",
    "decode",
    "over",
    "nixl",
    "blocks",
    "arrived",
    "intact",
    "tokens",
    "flow",
    "again",
    "quickly",
    "and",
    "safely",
    "now",
)


class BadRequest(ValueError):
    """The request body cannot be served (HTTP 400)."""


class ModelNotFound(ValueError):
    """The request names a model the engine does not serve (vLLM: HTTP 404)."""


def requested_adapter(
    engine: str, body: dict[str, Any], served_name: str, adapters: Sequence[str]
) -> str:
    """The LoRA adapter a request selects ("": the base model), as each engine reads it.
    vLLM: its name as the `model`; any other name than the served one is refused with 404
    ("The model `x` does not exist.", serving_engine.py `_check_model`). SGLang: the `model`
    `<served name>:<adapter>`, else the `lora_path` field (serving_base.py
    `_resolve_lora_path`); a bare name in `model` runs the base model, and an adapter it did
    not load is a 400 ("The following requested LoRA adapters are not loaded",
    lora_registry.py)."""
    model = str(body.get("model") or "")
    if engine == "vllm":
        if not model or model == served_name:
            return ""
        if model in adapters:
            return model
        raise ModelNotFound(f"The model `{model}` does not exist.")
    adapter = str(body.get("lora_path") or "")
    if ":" in model and model != served_name:
        adapter = (
            model[len(served_name) + 1 :]
            if model.startswith(served_name + ":")
            else (model.split(":", 1)[1])
        )
    if adapter and adapter not in adapters:
        raise BadRequest(f"The following requested LoRA adapters are not loaded: {adapter}")
    return adapter


@dataclass(frozen=True)
class Completion:
    kind: str
    model: str
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    stream: bool
    include_usage: bool
    body: dict[str, Any]  # the request as sent (kv_transfer_params, bootstrap_* ...)
    request_id: str

    @property
    def digest(self) -> bytes:
        return prompt_digest(self.prompt_tokens)


def parse_request(kind: str, body: Any, served_name: str, request_id: str = "") -> Completion:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    prompt = _prompt(kind, body)
    max_tokens = _max_tokens(kind, body)
    options = body.get("stream_options") or {}
    return Completion(
        kind=kind,
        model=str(body.get("model") or served_name),
        prompt_tokens=tuple(tokenize(prompt)),
        max_tokens=max_tokens,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        body=body,
        request_id=request_id or uuid.uuid4().hex,
    )


def _prompt(kind: str, body: dict[str, Any]) -> str | list[int]:
    if kind == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: a non-empty list is required")
        return "\n".join(
            f"{m.get('role', '')}: {_content_text(m.get('content'))}"
            for m in messages
            if isinstance(m, dict)
        )
    prompt = body.get("input_ids") if kind == GENERATE and "input_ids" in body else None
    if prompt is None:
        prompt = body.get("text" if kind == GENERATE else "prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch: the reference engine serves its first prompt
    if isinstance(prompt, str) or (
        isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
    ):
        return prompt
    field = "text or input_ids" if kind == GENERATE else "prompt"
    raise BadRequest(f"{field}: a string or a list of token ids is required")


def prompt_tokens(kind: str, body: dict[str, Any]) -> list[int]:
    """The token ids the engine computes for a request (its first prompt, for a batch)."""
    return tokenize(_prompt(kind, body))


def completion_prompts_tokens(body: dict[str, Any]) -> list[list[int]]:
    """Each prompt of a completions request, tokenized (vLLM renders a batch prompt by
    prompt; the engine itself serves the first)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return [prompt_tokens(COMPLETIONS, {"prompt": p}) for p in prompt]
    return [prompt_tokens(COMPLETIONS, body)]


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _max_tokens(kind: str, body: dict[str, Any]) -> int:
    if kind == GENERATE:
        value = (body.get("sampling_params") or {}).get("max_new_tokens", DEFAULT_MAX_TOKENS)
    else:
        value = body.get("max_completion_tokens", body.get("max_tokens", DEFAULT_MAX_TOKENS))
    try:
        number = int(DEFAULT_MAX_TOKENS if value is None else value)
    except (TypeError, ValueError):
        raise BadRequest(f"max_tokens must be an integer, not {value!r}") from None
    if number < 1:
        raise BadRequest("max_tokens must be at least 1")
    return number


def generated_words(digest: bytes, count: int) -> list[str]:
    words = []
    for i in range(count):
        h = hashlib.blake2b(digest + i.to_bytes(4, "little"), digest_size=4).digest()
        words.append(_VOCABULARY[int.from_bytes(h, "little") % len(_VOCABULARY)])
    return words


def generated_text(digest: bytes, count: int) -> str:
    return "".join(" " + w for w in generated_words(digest, count))


# -- whole responses ---------------------------------------------------------------------------


def response(req: Completion, count: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The non-streaming answer, with ``extra`` top-level fields (kv_transfer_params,
    pdd_refengine)."""
    text = generated_text(req.digest, count)
    usage = _usage(req, count)
    if req.kind == GENERATE:
        return {"text": text, "meta_info": _meta_info(req, count), **extra}
    if req.kind == CHAT:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": "length",
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
        obj = "text_completion"
    return {
        "id": _id(req),
        "object": obj,
        "created": int(time.time()),
        "model": req.model,
        "choices": [choice],
        "usage": usage,
        **extra,
    }


def _usage(req: Completion, count: int) -> dict[str, int]:
    prompt = len(req.prompt_tokens)
    return {"prompt_tokens": prompt, "completion_tokens": count, "total_tokens": prompt + count}


def _meta_info(req: Completion, count: int) -> dict[str, Any]:
    return {
        "id": req.request_id,
        "prompt_tokens": len(req.prompt_tokens),
        "completion_tokens": count,
        "cached_tokens": 0,
        "finish_reason": {"type": "length", "length": count},
    }


def _id(req: Completion) -> str:
    return ("chatcmpl-" if req.kind == CHAT else "cmpl-") + req.request_id


# -- streams -----------------------------------------------------------------------------------


def sse_events(req: Completion, count: int, extra: dict[str, Any]) -> Iterator[bytes]:
    """Server-sent events as vLLM/SGLang stream them, ending with ``data: [DONE]``."""
    words = generated_words(req.digest, count)
    for i, word in enumerate(words):
        last = i == len(words) - 1
        yield _sse(_chunk(req, i, " " + word, words, last, extra if last else {}))
    if req.include_usage and req.kind != GENERATE:
        yield _sse(
            {
                "id": _id(req),
                "object": _chunk_object(req),
                "created": int(time.time()),
                "model": req.model,
                "choices": [],
                "usage": _usage(req, count),
            }
        )
    yield b"data: [DONE]\n\n"


def _sse(document: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(document).encode() + b"\n\n"


def _chunk_object(req: Completion) -> str:
    return "chat.completion.chunk" if req.kind == CHAT else "text_completion"


def _chunk(
    req: Completion, i: int, piece: str, words: list[str], last: bool, extra: dict[str, Any]
) -> dict[str, Any]:
    finish = "length" if last else None
    if req.kind == GENERATE:  # SGLang streams the text so far
        meta = _meta_info(req, i + 1)
        if not last:
            meta["finish_reason"] = None
        return {"text": "".join(" " + w for w in words[: i + 1]), "meta_info": meta, **extra}
    if req.kind == CHAT:
        delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
        }
    else:
        choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}
    return {
        "id": _id(req),
        "object": _chunk_object(req),
        "created": int(time.time()),
        "model": req.model,
        "choices": [choice],
        **extra,
    }
