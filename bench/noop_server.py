"""A no-op inference server of shoal's own stack: the floor under shoal's frontend.

One process, one event loop (uvloop): aiohttp serves KServe v2 HTTP and grpc.aio serves
Triton's gRPC service, as a shoal frontend does, for the models of a repository. It
answers every inference at once with zero-filled outputs of each output's configured
shape (the request's batch in front), without a broker, a worker or shared memory: what
parsing a request and writing an answer costs on this stack, and nothing else. Enough of
the protocol for perf_analyzer (health, metadata, config, statistics with a success
count per model, infer); not a server to use.

    python bench/noop_server.py --model-repository DIR --http-port P --grpc-port Q
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import uvloop
from aiohttp import web
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shoal.configs.model_config import (
    config_to_json,
    model_metadata,
    parse_config_text,
    v2_datatype,
)

IHCL = "Inference-Header-Content-Length"
_ITEMSIZE = {"FP16": 2, "FP32": 4, "FP64": 8, "INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8,
             "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "BOOL": 1}  # fmt: skip


class Model:
    def __init__(self, directory: Path) -> None:
        cfg = parse_config_text((directory / "config.pbtxt").read_text(), directory.name)
        self.name = cfg.name or directory.name
        self.config_json = config_to_json(cfg)
        self.config_pb = model_config_pb2.ModelConfig.FromString(cfg.SerializeToString())
        self.meta = model_metadata(cfg, [1])
        self.max_batch_size = cfg.max_batch_size
        self.outputs = [(t.name, v2_datatype(t.data_type), list(t.dims)) for t in cfg.output]
        self.served = 0

    def zeros(self, batch: int) -> list[tuple[str, str, list[int], bytes]]:
        out = []
        for name, dt, dims in self.outputs:
            shape = [max(d, 1) for d in dims]
            if self.max_batch_size > 0:
                shape = [batch, *shape]
            out.append((name, dt, shape, bytes(int(np.prod(shape)) * _ITEMSIZE.get(dt, 1))))
        return out


def http_app(models: dict[str, Model]) -> web.Application:
    def model(request: web.Request) -> Model:
        m = models.get(request.match_info["model"])
        if m is None:
            raise web.HTTPNotFound()
        return m

    async def infer(request: web.Request) -> web.Response:
        m = model(request)
        body = await request.read()
        n = int(request.headers.get(IHCL, len(body)))
        head = json.loads(body[:n])
        batch = head["inputs"][0]["shape"][0] if m.max_batch_size > 0 else 1
        outs = m.zeros(batch)
        m.served += 1
        described = [
            {"name": o, "datatype": dt, "shape": s, "parameters": {"binary_data_size": len(b)}}
            for o, dt, s, b in outs
        ]
        doc = json.dumps({"model_name": m.name, "model_version": "1", "outputs": described})
        head_bytes = doc.encode()
        return web.Response(
            body=b"".join([head_bytes, *(b for *_, b in outs)]),
            headers={IHCL: str(len(head_bytes))},
            content_type="application/octet-stream",
        )

    async def ok(request: web.Request) -> web.Response:
        return web.Response()

    async def metadata(request: web.Request) -> web.Response:
        return web.json_response(model(request).meta)

    async def config(request: web.Request) -> web.Response:
        return web.json_response(model(request).config_json)

    async def stats(request: web.Request) -> web.Response:
        m = model(request)
        success = {"success": {"count": m.served}}
        doc = {"model_stats": [{"name": m.name, "version": "1", "inference_stats": success}]}
        return web.json_response(doc)

    async def server(request: web.Request) -> web.Response:
        return web.json_response({"name": "noop", "version": "0", "extensions": []})

    app = web.Application()
    r = app.router
    r.add_get("/v2", server)
    r.add_get("/v2/health/live", ok)
    r.add_get("/v2/health/ready", ok)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        r.add_get(base, metadata)
        r.add_get(base + "/ready", ok)
        r.add_get(base + "/config", config)
        r.add_get(base + "/stats", stats)
        r.add_post(base + "/infer", infer)
    return app


class Service(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, models: dict[str, Model]) -> None:
        self.models = models

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(name="noop", version="0")

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=request.name in self.models)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        md = self.models[request.name].meta
        t = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=md["name"],
            versions=md["versions"],
            platform=md["platform"],
            inputs=[t(**x) for x in md["inputs"]],
            outputs=[t(**x) for x in md["outputs"]],
        )

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelConfigResponse(config=self.models[request.name].config_pb)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        m = self.models[request.model_name]
        batch = request.inputs[0].shape[0] if m.max_batch_size > 0 else 1
        m.served += 1
        resp = service_pb2.ModelInferResponse(model_name=m.name, model_version="1")
        for name, dt, shape, data in m.zeros(batch):
            resp.outputs.add(name=name, datatype=dt, shape=shape)
            resp.raw_output_contents.append(data)
        return resp


def _load(repo: Path) -> dict[str, Model]:
    models = {}
    for d in sorted(repo.iterdir()):
        if (d / "config.pbtxt").is_file():
            try:
                m = Model(d)
            except Exception as exc:  # a model this floor cannot stand in for: left out
                print(f"noop: skipped {d.name}: {exc}", file=sys.stderr)
                continue
            models[m.name] = m
    return models


class _GenericOnly:
    """The server as the generated code sees it, taking its handlers as generic ones only,
    as shoal's frontend does (shoal/frontend/grpc_server.py): grpc.aio would otherwise
    wait on a pending future per registered method for every call."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        pass


async def _serve(args: argparse.Namespace) -> None:
    models = _load(args.model_repository)
    runner = web.AppRunner(http_app(models), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.http_port).start()
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        Service(models), _GenericOnly(server)
    )
    server.add_insecure_port(f"127.0.0.1:{args.grpc_port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-repository", type=Path, required=True)
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    uvloop.run(_serve(ap.parse_args()))


if __name__ == "__main__":
    main()
