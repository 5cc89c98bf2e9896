"""A TCP proxy on 127.0.0.1 that delays every chunk by a fixed latency each way (a WAN in front of loopback S3).

    with LatencyProxy("127.0.0.1", 8333, latency_s=0.025) as proxy:   # 50 ms round trip
        os.environ["AWS_ENDPOINT_URL"] = proxy.url

Each chunk read from one side is delivered to the other `latency_s` after it arrived, in order and
without throttling, so every request/response round trip gains 2 x latency_s while bandwidth stays
loopback's. Runs on an asyncio loop in a daemon thread; leaving the `with` block closes the listener
and every connection and stops the thread (bounded: nothing outlives the benchmark).
"""

from __future__ import annotations

import asyncio
import threading


class LatencyProxy:
    def __init__(self, host: str, port: int, latency_s: float):
        self.target = (host, port)
        self.latency_s = latency_s
        self.port = 0
        self.chunks = 0  # chunks delivered, both ways
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="latency-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def deliver() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                await asyncio.sleep(max(0.0, due - loop.time()))
                writer.write(data)
                self.chunks += 1
                await writer.drain()
            writer.close()

        sender = asyncio.create_task(deliver())
        try:
            while data := await reader.read(1 << 16):
                queue.put_nowait((loop.time() + self.latency_s, data))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            queue.put_nowait(None)
            await asyncio.gather(sender, return_exceptions=True)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w), return_exceptions=True)

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    def __enter__(self) -> LatencyProxy:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc) -> None:
        async def stop() -> None:
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
