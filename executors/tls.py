"""One TLS context per process for the service's outgoing HTTP clients.

httpx builds a new `ssl.SSLContext` for every client it makes, and with it reads the whole CA
bundle: about 30 ms of CPU, with the event loop blocked. `rest_executor` and `a2a_agent_executor`
make a client per attempt and webhooks one per delivery, so each such task stalled every other
request and task of the instance for that long (100 REST tasks took 4.5 s). A context may be
shared by any number of clients, so each kind is made once, the first time it is needed.
"""

from __future__ import annotations

import functools
import ssl


@functools.cache
def shared_context(trust_env: bool) -> ssl.SSLContext:
    """httpx's default context (certifi's CA bundle, certificates verified), made once.
    `trust_env`: honour SSL_CERT_FILE / SSL_CERT_DIR, as the client using it does."""
    import httpx  # lazy, as in the executors that use it

    return httpx.create_ssl_context(trust_env=trust_env)
