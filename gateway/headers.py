"""What the gateway does with request and response headers.

A client's headers are bounded in size (431 past ``max_header_bytes``), kept as the bytes
the client sent (any byte a server accepted is forwarded as is, never re-encoded), and
stripped of the hop-by-hop headers, of the headers named in ``Connection:`` and of every
routing-internal header: a client cannot steer a P/D sidecar (``x-prefiller-host-port``,
``x-encoder-hosts-ports``) or claim a destination (``x-gateway-destination-endpoint``);
the routing policy sets those itself at dispatch. Routing reads a latin-1 view of the rest.

The request id the gateway accounts a request under is its own (``x-gateway-request-id``,
also sent to the engine as ``x-request-id``); the client's ``x-request-id`` (at most
``MAX_CLIENT_ID`` characters) is logged, kept in the request's record and echoed back.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from .prompt import BodyError

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailers", "transfer-encoding", "upgrade", "host", "content-length",
                        "proxy-connection"})
# set by the gateway or its routing policy, never by a client
INTERNAL = frozenset({"x-prefiller-host-port", "x-encoder-hosts-ports", "x-gateway-destination-endpoint",
                      "x-gateway-request-id"})
GATEWAY_ID = "x-gateway-request-id"
CLIENT_ID = "x-request-id"
MAX_CLIENT_ID = 128


class HeaderError(Exception):
    """A request header the gateway refuses: ``status`` (400 or 431) and the header's name."""

    def __init__(self, status: int, field: str, msg: str) -> None:
        self.status = status
        self.field = field
        self.msg = msg
        super().__init__(f"{field}: {msg}")


@dataclass
class ClientHeaders:
    view: dict[str, str]                    # lower-case name -> value (latin-1); what routing reads and writes
    forward: list[tuple[bytes, bytes]]      # the client's headers as sent, stripped
    original: dict[str, str]                # the client's values in ``view`` before routing
    client_id: str                          # the client's x-request-id ("" when none)
    gateway_id: str                         # the gateway's own id for this request


def ingress(raw: list[tuple[bytes, bytes]], max_bytes: int) -> ClientHeaders:
    """The client's headers, bounded and stripped (HeaderError otherwise)."""
    size = sum(len(k) + len(v) + 4 for k, v in raw)
    if size > max_bytes:
        raise HeaderError(431, "headers", f"{size} bytes of headers, more than the {max_bytes} allowed")
    named = set()
    for k, v in raw:
        if k.lower() == b"connection":
            named.update(t.strip().lower().decode("latin-1") for t in v.split(b","))
    drop = HOP_BY_HOP | INTERNAL | named
    view: dict[str, str] = {}
    forward: list[tuple[bytes, bytes]] = []
    for k, v in raw:
        name = k.decode("latin-1").lower()
        if name in drop:
            continue
        view[name] = v.decode("latin-1")
        if name != CLIENT_ID:
            forward.append((name.encode("latin-1"), v))
    client_id = view.pop(CLIENT_ID, "")
    if len(client_id) > MAX_CLIENT_ID:
        raise HeaderError(400, "header.x-request-id", f"longer than {MAX_CLIENT_ID} characters")
    original = dict(view)
    gateway_id = uuid.uuid4().hex
    view[CLIENT_ID] = gateway_id   # the engine sees the gateway's id: unique per request
    return ClientHeaders(view, forward, original, client_id, gateway_id)


def upstream(client: ClientHeaders, destination: str) -> list[tuple[bytes, bytes]]:
    """Headers for the engine: the client's, with what routing set or removed in ``view``
    (e.g. the P/D stage headers), the gateway's request id and the destination."""
    view, orig = client.view, client.original
    out = [(k, v) for k, v in client.forward if view.get(n := k.decode("latin-1")) == orig[n]]
    for name, value in view.items():
        if value is None or name in HOP_BY_HOP or name == "x-gateway-destination-endpoint":
            continue
        if orig.get(name) != value:     # set or changed by routing
            out.append((name.encode("latin-1"), str(value).encode("utf-8")))
    out.append((b"x-gateway-destination-endpoint", destination.encode()))
    return out


def downstream(raw: list[tuple[bytes, bytes]], client: ClientHeaders, destination: str) -> list[tuple[bytes, bytes]]:
    """Response headers for the client: the engine's (hop-by-hop and ids dropped), the
    destination, the client's id echoed (the gateway's when it sent none) and the gateway's id."""
    drop = HOP_BY_HOP | INTERNAL | {CLIENT_ID, "date", "server"}    # the gateway's server sets date and server
    out = [(k, v) for k, v in raw if k.lower().decode("latin-1") not in drop]
    out.append((b"x-gateway-destination-endpoint", destination.encode()))
    out.append((CLIENT_ID.encode(), (client.client_id or client.gateway_id).encode("latin-1")))
    out.append((GATEWAY_ID.encode(), client.gateway_id.encode()))
    return out


def priority(view: dict[str, str], objectives: dict[str, int], allowed: set[int]) -> int:
    """The request's priority: ``x-llm-d-priority`` when it is one of ``allowed`` (any other
    integer counts as 0: a client cannot create bands), else its objective's, else 0."""
    prio = 0
    obj = view.get("x-llm-d-inference-objective") or view.get("x-gateway-inference-objective")
    if obj:
        prio = objectives.get(obj, 0)
    if "x-llm-d-priority" in view:
        raw = view["x-llm-d-priority"].strip()
        try:
            asked = int(raw) if len(raw) <= 20 else None
        except ValueError:
            asked = None
        if asked is None:
            raise BodyError("header.x-llm-d-priority", "must be an integer")
        prio = asked if asked in allowed else 0
    return prio
