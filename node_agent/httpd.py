"""The stdlib HTTP server as the agent and the controller run it: a client that goes away is not an error.

Input: errors raised while a request is served. Output: nothing on stderr for a peer that closed, reset or
timed out mid-request (``BrokenPipeError``, ``ConnectionResetError``, ``TimeoutError``: a scraper's timeout,
a killed curl); anything else is logged through ``logging`` with its traceback, never printed raw.
``socketserver``'s default prints every one of them to stderr.
"""

from __future__ import annotations

import logging
import sys
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

PEER_GONE = (ConnectionError, TimeoutError)
"""Errors that mean the client left (ConnectionError covers broken pipe, reset and aborted)."""


class QuietThreadingHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, PEER_GONE):
            log.debug("client %s went away: %s", client_address, exc)
            return
        log.error("error serving %s", client_address, exc_info=True)
