"""An OTLP/HTTP receiver that accepts span batches and drops them: what `bench/ab.py` exports to
when it measures traces on (bench/README.md, "Traces").

    .venv/bin/python bench/otlp_sink.py 4318 &
    OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces \\
        .venv/bin/python bench/ab.py ../old . --rounds 6

Each batch is decoded (so a malformed body would show) and counted; the count is printed on exit.
"""

from __future__ import annotations

import sys

import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

SPANS = [0]


async def traces(request: Request) -> Response:
    message = ExportTraceServiceRequest()
    message.ParseFromString(await request.body())
    SPANS[0] += sum(len(s.spans) for r in message.resource_spans for s in r.scope_spans)
    return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")


if __name__ == "__main__":
    app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]) if len(sys.argv) > 1 else 4318, log_level="warning")
    print(f"spans received: {SPANS[0]}")
