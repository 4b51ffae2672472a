"""A rank's ZMQ sockets, as SGLang's: one PULL socket on the pod's address at a port the
kernel picks, which the bootstrap server hands out as ``rank_ip`` / ``rank_port`` (SGLang
binds a free port, common/conn.py of 0.5.4 L71-73, L95-96), and a PUSH socket per peer rank
it sends to, kept from one message to the next as SGLang keeps them (L429-439).

pyzmq, as SGLang itself: the exchange's framing is ZMTP, and reusing the library SGLang uses
keeps the sockets' behaviour (a PUSH queues until its peer is up) the same as the engine's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import zmq
import zmq.asyncio

from pdd_refengine.sglang_exchange import Endpoint

log = logging.getLogger(__name__)

MessageHandler = Callable[[list[bytes]], None]
SEND_TIMEOUT_S = 5.0  # a PUSH queues while its peer is away; this bounds a full queue


class RankSockets:
    def __init__(self, ip: str, handle: MessageHandler) -> None:
        self._ip = ip
        self._handle = handle
        # Made in start(): a vLLM-mode engine, which has no rank socket, makes none.
        self._context: zmq.asyncio.Context | None = None
        self._pull: zmq.asyncio.Socket | None = None
        self._pushes: dict[Endpoint, zmq.asyncio.Socket] = {}
        self._receiving: asyncio.Task[None] | None = None
        self.endpoint = Endpoint(ip, 0)

    def start(self) -> Endpoint:
        """Bind the PULL socket and deliver what comes to the handler, on this event loop."""
        self._context = zmq.asyncio.Context()
        self._pull = self._context.socket(zmq.PULL)
        port = self._pull.bind_to_random_port(f"tcp://{self._ip}")
        self.endpoint = Endpoint(self._ip, port)
        self._receiving = asyncio.get_running_loop().create_task(self._receive())
        return self.endpoint

    async def _receive(self) -> None:
        assert self._pull is not None
        while True:
            frames = await self._pull.recv_multipart()
            try:
                self._handle(list(frames))
            except Exception:  # one malformed message must not stop the rank's socket
                log.exception("an SGLang rank message (%d frames) was refused", len(frames))

    async def send(self, to: Endpoint, frames: list[bytes]) -> None:
        push = self._pushes.get(to)
        if push is None:
            assert self._context is not None, "the rank's sockets are not started"
            push = self._pushes[to] = self._context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(f"tcp://{to.ip}:{to.port}")
        await asyncio.wait_for(push.send_multipart(frames), SEND_TIMEOUT_S)

    def forget(self, peer: Endpoint) -> None:
        """Drop the PUSH socket to a peer that failed: what is queued for it must not reach
        whichever process listens at that address next."""
        push = self._pushes.pop(peer, None)
        if push is not None:
            push.close(linger=0)

    async def close(self) -> None:
        if self._receiving is not None:
            self._receiving.cancel()
            await asyncio.gather(self._receiving, return_exceptions=True)
        for peer in list(self._pushes):
            self.forget(peer)
        if self._pull is not None:
            self._pull.close(linger=0)
        if self._context is not None:
            self._context.term()
