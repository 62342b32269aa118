"""The route a request takes when the pool cannot serve it (a worker's death or timeout, no
shared memory, no live worker, an input the workers do not take): encoded in this process on the
route it would have taken without the pool, so the IDs never depend on the pool — inline for a
synchronous caller, on a thread otherwise (an event loop never waits behind an encode)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from dtok.pool.records import Request

__all__ = ["InProcessRoute"]


class InProcessRoute:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer.with_knobs(content_lookup=False)  # no session state
        self.executor = ThreadPoolExecutor(2, thread_name_prefix="dtok-pool-failover")

    def encode(self, text, add_special):
        """The request's exact IDs, or the reference's own exception."""
        return self.tokenizer.encode(text, add_special_tokens=add_special)

    def answer(self, req: Request, resolve: Callable, then: Callable, inline: bool = False) -> None:
        """Encode ``req`` here and ``resolve`` it (or set the reference's exception), then call
        ``then``; inline, or on one of the route's threads."""
        def run():
            try:
                resolve(req, self.encode(req.text, req.add_special))
            except BaseException as exc:  # noqa: BLE001 - the reference's own error
                if not req.future.done():
                    req.future.set_exception(exc)
            finally:
                then()

        if inline:
            run()
        else:
            self.executor.submit(run)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
