"""A stand-in inference engine for the NIXL tests: one real ``nixl_agent`` with a DRAM buffer,
driven by JSON-line commands on stdin, answering JSON lines on stdout (after ``@@engine ``;
UCX and NIXL may print other lines).

Commands: init, register, sync, write, digest, check, exit. It talks to its sidecar only through
``pdd_sidecar.client``, as a real engine would.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from typing import Any

import numpy as np

MARKER = "@@engine "


class Engine:
    def __init__(self) -> None:
        self.agent: Any = None
        self.buffer: np.ndarray | None = None
        self.client: Any = None
        self.sync: Any = None
        self.heartbeat: Any = None

    def init(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from nixl._api import nixl_agent, nixl_agent_config

        from pdd_sidecar.client import PeerSync, SidecarClient

        self.agent = nixl_agent(cmd["name"], nixl_agent_config(backends=["UCX"]))
        self.buffer = np.zeros(int(cmd["nbytes"]), dtype=np.uint8)
        self.agent.register_memory([(self.buffer.ctypes.data, self.buffer.nbytes, 0, "")], "DRAM")
        with open(cmd["token_file"], encoding="utf-8") as fh:
            self.client = SidecarClient(cmd["sidecar_url"], fh.read().strip())
        metadata = self.agent.get_agent_metadata()
        if cmd["mode"] == "etcd":
            self.agent.send_local_metadata()  # NIXL writes its keys to etcd itself
        else:
            self.heartbeat = self.client.keep_published(cmd["name"], metadata, ttl_s=30)
        self.sync = PeerSync(self.client, self.agent, fetch_via=cmd["mode"])
        return {
            "addr": self.buffer.ctypes.data,
            "nbytes": self.buffer.nbytes,
            "sha256": hashlib.sha256(metadata).hexdigest(),
        }

    def register(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Mode etcd: tell the sidecar the agent's name (the metadata is in etcd)."""
        return dict(self.client.publish(self.agent.name, b""))

    def do_sync(self, cmd: dict[str, Any]) -> dict[str, Any]:
        report = self.sync.sync(wait_s=float(cmd.get("wait_s", 0)))
        return {
            "version": report.version,
            "added": report.added,
            "removed": report.removed,
            "failed": report.failed,
            "loaded": {name: list(identity) for name, identity in self.sync.loaded.items()},
        }

    def write(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.buffer is not None
        nbytes = int(cmd["nbytes"])
        data = np.frombuffer(np.random.default_rng(int(cmd["seed"])).bytes(nbytes), np.uint8)
        self.buffer[:nbytes] = data
        local = self.agent.get_xfer_descs([(self.buffer.ctypes.data, nbytes, 0)], "DRAM")
        remote = self.agent.get_xfer_descs([(int(cmd["remote_addr"]), nbytes, 0)], "DRAM")
        handle = self.agent.initialize_xfer("WRITE", local, remote, cmd["peer"], b"test")
        state = self.agent.transfer(handle)
        deadline = time.monotonic() + 20
        while state == "PROC" and time.monotonic() < deadline:
            time.sleep(0.001)
            state = self.agent.check_xfer_state(handle)
        handle.release()
        return {"state": state, "digest": _digest(data)}

    def digest(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.buffer is not None
        return {"digest": _digest(self.buffer[: int(cmd["nbytes"])])}

    def check(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"loaded": bool(self.agent.check_remote_metadata(cmd["peer"]))}


def _digest(data: np.ndarray) -> str:
    return hashlib.blake2b(memoryview(np.ascontiguousarray(data)), digest_size=16).hexdigest()


def main() -> int:
    engine = Engine()
    handlers = {
        "init": engine.init,
        "register": engine.register,
        "sync": engine.do_sync,
        "write": engine.write,
        "digest": engine.digest,
        "check": engine.check,
    }
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            return 0
        try:
            answer = {"ok": True, **handlers[cmd["op"]](cmd)}
        except Exception as exc:  # reported to the test, which decides
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(MARKER + json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
