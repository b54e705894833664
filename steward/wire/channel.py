"""Length-prefixed frames over the front/worker socketpair.

A socketpair (not `multiprocessing.Pipe`) so the front can read it with asyncio streams
and never park its event loop on a blocking read; the worker side is plain blocking I/O.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

HEADER = struct.Struct("!I")
MAX_FRAME = 256 * 1024 * 1024


def frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME:
        raise ValueError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(len(payload)) + payload


class BlockingChannel:
    """The worker's end: thread-safe sends, blocking receives."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._file = sock.makefile("rb")

    def send(self, payload: bytes) -> None:
        data = frame(payload)
        with self._lock:
            self._sock.sendall(data)

    def recv(self) -> bytes:
        """Next frame; raises EOFError when the other side is gone."""
        header = self._file.read(HEADER.size)
        if len(header) < HEADER.size:
            raise EOFError
        (size,) = HEADER.unpack(header)
        payload = self._file.read(size)
        if len(payload) < size:
            raise EOFError
        return payload


class AsyncChannel:
    """The front's end, on asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> AsyncChannel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=MAX_FRAME)
        return cls(reader, writer)

    def send(self, payload: bytes) -> None:
        """Buffered, never blocks; a dead peer shows up as EOF on `recv`."""
        if not self._writer.is_closing():
            self._writer.write(frame(payload))

    async def recv(self) -> bytes:
        try:
            header = await self._reader.readexactly(HEADER.size)
            (size,) = HEADER.unpack(header)
            return await self._reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise EOFError from exc

    def close(self) -> None:
        self._writer.close()
