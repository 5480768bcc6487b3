"""Ask a node's agent to reset GPUs: the controller side of the agent's signed ``/v1/control/reset``.

Input: the node, the GPUs (empty: all), the URL template (``http://{node}:9400``), the shared secret (the
push secret: one secret per cluster, already on every node with mode 0600). Output: the agent's JSON answer,
or ``AgentControlError`` carrying the node, the URL and why (refused, timeout, 4xx/5xx with the agent's
message). Each request carries a fresh ``request_id``, the agent's single-use nonce: a reset is never
retried here (it is not idempotent); the lifecycle sees the failure and decides.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from node_agent.httpclient import HttpClient, urlopen
from node_agent.protocol import CONTROL_RESET_PATH, ResetRequest, signed_headers


class AgentControlError(RuntimeError):
    def __init__(self, node: str, url: str, detail: str, status: int | None = None) -> None:
        self.node, self.url, self.detail, self.status = node, url, detail, status
        super().__init__(f"{node}: POST {url}: {detail}")


def new_request_id() -> str:
    return "rst-" + secrets.token_hex(12)


class AgentControl:
    def __init__(
        self,
        url_template: str,
        secret: bytes,
        *,
        timeout_s: float = 120.0,
        clock: Callable[[], float] = time.time,
        client: HttpClient | None = None,
    ) -> None:
        """``client``: basic auth and TLS for agents served with a web-config file (``sense``'s)."""
        if "{node}" not in url_template:
            raise ValueError(f"control URL template must contain '{{node}}', got {url_template!r}")
        self.url_template = url_template.rstrip("/")
        self.secret = secret
        self.timeout_s = timeout_s
        self.clock = clock
        self.client = client

    def url(self, node: str) -> str:
        """The template with ``{node}`` filled in and the reset path appended to its path (a query, as in
        ``http://127.0.0.1:9400/?node={node}`` for a test agent, is kept)."""
        parts = urllib.parse.urlsplit(self.url_template.replace("{node}", urllib.parse.quote(node, safe="")))
        return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + CONTROL_RESET_PATH))

    def request(self, node: str, gpus: Sequence[int], request_id: str | None = None) -> tuple[str, bytes]:
        """(url, body) of a reset request; exposed for dry-run logging and tests."""
        req = ResetRequest(node=node, gpus=list(gpus), request_id=request_id or new_request_id())
        return self.url(node), req.model_dump_json().encode()

    def reset(self, node: str, gpus: Sequence[int], request_id: str | None = None) -> dict[str, Any]:
        url, body = self.request(node, gpus, request_id)
        headers = signed_headers(self.secret, node, int(self.clock()), body)
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urlopen(req, self.timeout_s, self.client) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            with contextlib.suppress(ValueError, AttributeError):
                detail = json.loads(detail).get("error", detail)
            raise AgentControlError(node, url, f"HTTP {err.code}: {detail}", err.code) from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise AgentControlError(node, url, str(getattr(err, "reason", err))) from None
