"""Serving the API with uvicorn until the command's stop event is set.

uvicorn runs in a thread of its own, so that the command's signal handling
(:func:`gpulens.commands.service.run_service`) stays the one every command has: SIGTERM or
Ctrl-C sets the stop event, and the server finishes the requests in flight and returns.
"""

from __future__ import annotations

import threading

import uvicorn
from fastapi import FastAPI

from gpulens.api.exceptions import ApiError

__all__ = ["serve"]

POLL_S = 0.2
"""How often the stop event and the server are looked at."""


def serve(app: FastAPI, *, host: str, port: int, stop: threading.Event) -> None:
    """Serve ``app`` on ``host:port`` until ``stop`` is set.

    Raises :class:`ApiError` when the server stops on its own (its port is taken: uvicorn
    logs why).
    """
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    while not stop.wait(POLL_S):
        if not thread.is_alive():
            raise ApiError(f"the API stopped serving on {host}:{port} (is the port taken? see the log above)")
    server.should_exit = True
    thread.join()
