"""A scripted Triton gRPC server: enough of GRPCInferenceService for the gateway's adapter, and a
record of what it received (requests and their gRPC metadata)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

ENSEMBLE = """
name: "ensemble"
platform: "ensemble"
max_batch_size: 8
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] }
]
"""


@dataclass
class FakeTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    tokens: list[int]
    requests: list[service_pb2.ModelInferRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    # Streams opened, and those the client ended before writing a request on them.
    streams: int = 0
    cancelled_unused: int = 0

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=True)

    async def ModelConfig(self, request, context):
        config = text_format.Parse(ENSEMBLE, model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStreamInfer(
        self, request_iterator, context
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        self.streams += 1
        self.metadata.append({k: v for k, v in context.invocation_metadata()})
        try:
            request = await anext(aiter(request_iterator))
        except asyncio.CancelledError:
            self.cancelled_unused += 1
            raise
        except StopAsyncIteration:  # how a cancelled call can look from here too
            self.cancelled_unused += 1
            return
        self.requests.append(request)
        for token in self.tokens:
            response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
            out = response.outputs.add()
            out.name, out.datatype = "output_ids", "INT32"
            out.shape.extend([1, 1, 1])
            response.raw_output_contents.append(np.array([[[token]]], dtype=np.int32).tobytes())
            yield service_pb2.ModelStreamInferResponse(infer_response=response)
        final = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
        final.parameters["triton_final_response"].bool_param = True
        yield service_pb2.ModelStreamInferResponse(infer_response=final)


async def start_fake_triton(servicer: FakeTriton, port: int = 0) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, f"127.0.0.1:{port}"
