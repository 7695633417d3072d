"""Everything this server fetches for a tenant goes through here: one client, whose bounds a caller
cannot leave out (issue 70, "outbound requests"; docs/media.md, "Remote URLs").

Each entry point takes a `Bounds` (no defaults) and applies every one of its limits itself: the
addresses (every connection to an address vetted against `Bounds.networks`, public ones otherwise,
resolved once per hop so that no second DNS answer switches the target), the bytes of one answer,
the operation's time (and each step's), and its requests (redirect hops, pages, messages).

| entry point | used for | one operation is | requests are |
|---|---|---|---|
| `fetch_url` | media URLs, the Hub's listing | one URL read whole | redirect hops |
| `open_url` | an import's https and Hub files | one URL opened, its body streamed | redirect hops |
| `mcp_session` | hosted MCP tools | one MCP operation (a listing, a call) | the session's messages, pages |
| `s3.s3_client` | S3 imports (any endpoint, whoever signs) | one S3 client (an import) | listing pages |

No other module of modelhost constructs an HTTP client or opens a network connection, but the
operator-side ones that tests/test_outbound.py lists with their reasons (the operator's identity
provider and bucket, the CLI, replicas on loopback): that test walks every module and fails on a new one.
`outbound.mcp` (the `mcp` SDK) and `outbound.s3` (botocore) are imported by their users only.
"""

from modelhost.outbound.addresses import Vetted, address_allowed, parse_networks, vet
from modelhost.outbound.bounds import Bounds, FetchFailed, IPAddress, IPNetwork
from modelhost.outbound.http import RemoteResponse, fetch_url, open_url

__all__ = [
    "Bounds",
    "FetchFailed",
    "IPAddress",
    "IPNetwork",
    "RemoteResponse",
    "Vetted",
    "address_allowed",
    "fetch_url",
    "open_url",
    "parse_networks",
    "vet",
]
