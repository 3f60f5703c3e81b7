"""The deployment manifests (deploy/kubernetes, deploy/kserve), checked offline: built-in
kinds against Kubernetes' own schemas (kubernetes-validate), custom resources against
the CRDs their projects release (tests/data/crds), unknown fields refused in both; then
what ties them together (ports, probes, the stop's timing, the autoscaler's metric)."""

from __future__ import annotations

import copy
import gzip
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "tests/data/crds"
#: The oldest Kubernetes release the manifests are for, and the newest the schemas know.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
MANIFESTS = sorted(
    p
    for folder in ("deploy/kubernetes", "deploy/kserve")
    for p in (ROOT / folder).glob("*.yaml")
    if p.name != "kustomization.yaml"
)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _all() -> list[dict[str, Any]]:
    return [d for p in MANIFESTS for d in _docs(p)]


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [d for d in _all() if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return found


def _closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others, as the
    API server's strict field validation (kubectl's default) refuses unknown fields."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the closed openAPIV3Schema of each served version."""
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml.gz")):
        crd = yaml.safe_load(gzip.decompress(path.read_bytes()))
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = _closed(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
                schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_manifest_is_valid_against_its_schema(path: Path) -> None:
    docs = _docs(path)
    assert docs, path
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in _crd_schemas():
            errors = sorted(
                jsonschema.Draft7Validator(_crd_schemas()[key]).iter_errors(doc),
                key=lambda e: list(e.path),
            )
            assert not errors, "\n".join(
                f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors
            )
        else:
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def test_the_checks_refuse_a_misspelled_field() -> None:
    """(the tests above would pass anything if the schemas were open)"""
    deployment = copy.deepcopy(_one("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    runtime = copy.deepcopy(_one("ServingRuntime"))
    runtime["spec"]["protocolVersion"] = ["v2"]
    schema = _crd_schemas()[("serving.kserve.io/v1alpha1", "ServingRuntime")]
    assert list(jsonschema.Draft7Validator(schema).iter_errors(runtime))


def _container() -> dict[str, Any]:
    (container,) = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _flag(args: list[str], name: str, default: str) -> str:
    for arg in args:
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return default


def test_probes_are_shoals_health_endpoints_and_the_stop_fits_the_grace_period() -> None:
    container = _container()
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = int(command[1])
    drain = float(_flag(container["args"], "--exit-timeout-secs", "30"))
    grace = _one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # readiness turns the pod away before preStop ends; then the drain, then the broker
    # and the workers (10 s, as shoal serve gives them)
    ready = container["readinessProbe"]
    assert ready["periodSeconds"] * ready["failureThreshold"] <= pre_stop
    assert grace >= pre_stop + drain + 10
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/models", "/dev/shm"} <= mounts


def test_the_service_and_the_monitor_reach_the_containers_ports() -> None:
    ports = {p["name"]: p["containerPort"] for p in _container()["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    service = _one("Service")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    labels = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    monitor = _one("ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]


def test_the_autoscaler_scales_the_deployment_on_the_metric_the_adapter_serves() -> None:
    hpa = _one("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == _one("Deployment")["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    adapter = yaml.safe_load(_one("ConfigMap", "adapter-config")["data"]["config.yaml"])
    (rule,) = adapter["rules"]
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
    series = re.match(r"[a-z_]+", rule["seriesQuery"])
    assert series is not None
    # a metric shoal exports
    assert f'"{series.group(0)}"' in (ROOT / "shoal/frontend/metrics.py").read_text()


def test_kustomization_lists_every_manifest_but_the_adapters() -> None:
    kustomization = yaml.safe_load((ROOT / "deploy/kubernetes/kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in MANIFESTS if p.parent.name == "kubernetes"}
    assert listed == on_disk - {"prometheus-adapter.yaml"}


def test_the_serving_runtime_speaks_v2_over_rest_and_grpc_for_its_formats() -> None:
    runtime = _one("ServingRuntime")
    spec = runtime["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    assert {f["name"] for f in spec["supportedModelFormats"]} == {"onnx", "pytorch", "triton"}
    (container,) = spec["containers"]
    args = container["args"]
    assert _flag(args, "--http-port", "") == "8080"  # KServe's ports
    assert _flag(args, "--grpc-port", "") == "9000"
    assert _flag(args, "--model-store", "") == "/mnt/models"
    for service in [d for d in _all() if d["kind"] == "InferenceService"]:
        model = service["spec"]["predictor"]["model"]
        assert model["runtime"] == runtime["metadata"]["name"]
        assert model["protocolVersion"] in spec["protocolVersions"]
        if model["protocolVersion"] == "grpc-v2":
            assert [p["containerPort"] for p in model["ports"]] == [9000]


def test_the_runtimes_arguments_are_shoal_serves() -> None:
    """Every argument the manifests give the image's `shoal serve` is one it takes."""
    import argparse

    from shoal.cli import serve_parser

    parser = argparse.ArgumentParser()
    serve = serve_parser(parser.add_subparsers())
    for args in (_container()["args"], _one("ServingRuntime")["spec"]["containers"][0]["args"]):
        serve.parse_args(args)
