"""A loopback TCP proxy that makes network trouble on demand: it delays what passes, holds it
back (a blackhole: connections stay open, nothing gets through, as when packets are dropped and
TCP keeps retransmitting), or cuts every connection at once (resets)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class ChaosProxy:
    def __init__(self, target: str) -> None:
        self.target_host, port = target.rsplit(":", 1)
        self.target_port = int(port)
        self.delay = 0.0
        self._open = asyncio.Event()  # set: data flows; clear: held back
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: Any = None
        self.address = ""
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> ChaosProxy:
        self._thread.start()
        self._call(self._start()).result(10)
        return self

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _start(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            client_w.transport.abort()
            return
        self._writers |= {client_w, server_w}
        await asyncio.gather(
            self._pump(client_r, server_w), self._pump(server_r, client_w), return_exceptions=True
        )
        for writer in (client_w, server_w):
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._open.wait()
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass  # a peer reset (or a cut): this direction ends
        writer.transport.abort()

    # --- trouble, from any thread

    def set_delay(self, seconds: float) -> None:
        self.delay = seconds

    def hold(self) -> None:
        self._loop.call_soon_threadsafe(self._open.clear)

    def release(self) -> None:
        self._loop.call_soon_threadsafe(self._open.set)

    def cut(self) -> None:
        """Resets every connection through the proxy (new ones are accepted again)."""

        def abort_all() -> None:
            for writer in list(self._writers):
                writer.transport.abort()

        self._loop.call_soon_threadsafe(abort_all)

    def calm(self) -> None:
        self.set_delay(0.0)
        self.release()

    def close(self) -> None:
        async def shut() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            # every connection's task ends here, not destroyed pending when the loop stops
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self._call(shut()).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
