"""What the kind e2e feeds the cluster, checked where there is no Docker: the stand-in example
is still a valid PDDeployment and the stand-in engine answers the probes the operator renders."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from helpers.operator_proc import free_port
from pdd_operator.api.v1alpha1 import PDDeployment

from .test_kind import ENGINE_IMAGE, stand_in_example

ENGINE = Path(__file__).resolve().parent / "engine" / "server.py"


def test_stand_in_example_is_a_valid_pddeployment() -> None:
    body = stand_in_example()
    body["metadata"] |= {"namespace": "default", "uid": "u", "generation": 1}
    pdd = PDDeployment.from_body(body)
    assert pdd.spec.engine.image == ENGINE_IMAGE
    assert (pdd.spec.prefill.replicas, pdd.spec.decode.replicas) == (2, 4)


def test_stand_in_engine_answers_like_vllm() -> None:
    port = free_port()
    # As the operator starts it: `vllm serve MODEL ... --port N` with flags it does not know.
    argv = ["serve", "meta-llama/Llama-3.1-70B-Instruct", "--kv-transfer-config", "{}",
            "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen([sys.executable, str(ENGINE), *argv])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    assert r.status == 200
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1) as r:
            models = json.load(r)
        assert models["data"][0]["id"] == "meta-llama/Llama-3.1-70B-Instruct"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
