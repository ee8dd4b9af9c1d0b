"""JSON schemas for the custom resources of deploy/k8s that kubernetes-validate does not know, written
from the CRDs of the pinned releases for the fields these manifests use, and stricter than the CRDs
(unknown fields are errors here; a cluster would prune them silently). No package on PyPI or npm
ships these CRDs as schemas a Python test can load offline, so the constraints are transcribed here
(types, enums, patterns, bounds, required fields), each from the source named:

- InferencePool `inference.networking.k8s.io/v1`: kubernetes-sigs/gateway-api-inference-extension
  v1.5.0 (df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849),
  config/crd/bases/inference.networking.k8s.io_inferencepools.yaml (the release llm-d-router v0.10.0's
  go.mod requires, with gateway-api v1.5.1).
- InferenceObjective `llm-d.ai/v1alpha2`: llm-d/llm-d-router v0.10.0
  (71f4f0999f95b96c49a9d0c4afbd18dfdb943c26), config/crd/bases/llm-d.ai_inferenceobjectives.yaml.
- HTTPRoute `gateway.networking.k8s.io/v1`: kubernetes-sigs/gateway-api v1.5.1
  (e7677b70ae75d14a4448fba94870e7deea6cf0ad), config/crd/standard/gateway.networking.k8s.io_httproutes.yaml.
- EndpointPickerConfig `llm-d.ai/v1alpha1` (the EPP's plugins file, not a cluster object): llm-d/llm-d-router
  v0.10.0, apix/config/v1alpha1/endpointpickerconfig_types.go and the parameters of the plugins used,
  which the EPP decodes strictly (an unknown parameter stops it): the metrics data source's
  (pkg/epp/framework/plugins/datalayer/source/metrics/datasource.go: scheme, path, port 1-65535,
  insecureSkipVerify, caCertPath, clientCertPath, clientKeyPath, interval; `port` is new in v0.10.0,
  v0.9.0 refuses it) and the core metrics extractor's (extractor/metrics/factories.go:
  engineLabelKey, defaultEngine, engineConfigs).
"""

from __future__ import annotations

from typing import Any

DNS_1123 = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
GROUP = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
KIND = r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
GATEWAY_DURATION = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
PORT_NUMBER = {"type": "integer", "minimum": 1, "maximum": 65535}
NAME = {"type": "string", "minLength": 1, "maxLength": 253}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties, "required": required}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    metadata = _object(
        {
            "name": {"type": "string", "pattern": DNS_1123, "maxLength": 253},
            "namespace": {"type": "string"},
            "labels": STRING_MAP,
            "annotations": STRING_MAP,
        },
        ["name"],
    )
    return _object(
        {"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": metadata, "spec": spec},
        ["apiVersion", "kind", "metadata", "spec"],
    )


INFERENCE_POOL = _resource(
    "inference.networking.k8s.io/v1",
    "InferencePool",
    _object(
        {
            "targetPorts": {
                "type": "array",
                "minItems": 1,
                "maxItems": 8,
                # The CRD's CEL rule: port numbers are unique (the items hold only the number).
                "uniqueItems": True,
                "items": _object({"number": PORT_NUMBER}, ["number"]),
            },
            "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
            "selector": _object(
                {
                    "matchLabels": {
                        "type": "object",
                        "minProperties": 1,
                        "maxProperties": 64,
                        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
                    }
                },
                ["matchLabels"],
            ),
            "endpointPickerRef": {
                **_object(
                    {
                        "group": {"type": "string", "maxLength": 253, "pattern": GROUP},
                        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": KIND},
                        "name": NAME,
                        "port": _object({"number": PORT_NUMBER}, ["number"]),
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                    ["name"],
                ),
                # The CRD's CEL rule: a Service (the default kind) needs its port.
                "if": {
                    "anyOf": [
                        {"not": {"required": ["kind"]}},
                        {"required": ["kind"], "properties": {"kind": {"const": "Service"}}},
                    ]
                },
                "then": {"required": ["port"]},
            },
        },
        ["endpointPickerRef", "selector", "targetPorts"],
    ),
)

_POOL_REF = _object(
    {
        "group": {"type": "string", "maxLength": 253, "pattern": GROUP},
        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": KIND},
        "name": NAME,
    },
    ["name"],
)
INFERENCE_OBJECTIVE = _resource(
    "llm-d.ai/v1alpha2",
    "InferenceObjective",
    _object(
        {"poolRef": _POOL_REF, "priority": {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}},
        ["poolRef"],
    ),
)

_PARENT_REF = _object(
    {
        "group": {"type": "string", "maxLength": 253, "pattern": GROUP},
        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": KIND},
        "name": NAME,
        "namespace": {
            "type": "string",
            "minLength": 1,
            "maxLength": 63,
            "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        },
        "port": PORT_NUMBER,
        "sectionName": {"type": "string", "minLength": 1, "maxLength": 253, "pattern": DNS_1123},
    },
    ["name"],
)
_BACKEND_REF = _object(
    {
        "group": {"type": "string", "maxLength": 253, "pattern": GROUP},
        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": KIND},
        "name": NAME,
        "namespace": {"type": "string", "minLength": 1, "maxLength": 63},
        "port": PORT_NUMBER,
        "weight": {"type": "integer", "minimum": 0, "maximum": 1000000},
    },
    ["name"],
)
_MATCH = _object(
    {
        "path": _object(
            {
                "type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
                "value": {"type": "string", "maxLength": 1024},
            },
            [],
        ),
    },
    [],
)
HTTP_ROUTE = _resource(
    "gateway.networking.k8s.io/v1",
    "HTTPRoute",
    _object(
        {
            "parentRefs": {"type": "array", "maxItems": 32, "items": _PARENT_REF},
            "hostnames": {"type": "array", "maxItems": 16, "items": {"type": "string"}},
            "rules": {
                "type": "array",
                "minItems": 1,
                "maxItems": 16,
                "items": _object(
                    {
                        "name": {"type": "string"},
                        "matches": {"type": "array", "maxItems": 64, "items": _MATCH},
                        "backendRefs": {"type": "array", "maxItems": 16, "items": _BACKEND_REF},
                        "timeouts": _object(
                            {
                                "request": {"type": "string", "pattern": GATEWAY_DURATION},
                                "backendRequest": {"type": "string", "pattern": GATEWAY_DURATION},
                            },
                            [],
                        ),
                    },
                    [],
                ),
            },
        },
        [],
    ),
)

# Per plugin type, its parameters (those these manifests set).
_PLUGIN_PARAMETERS: dict[str, dict[str, Any]] = {
    "metrics-data-source": _object(
        {
            "scheme": {"enum": ["http", "https"]},
            "path": {"type": "string", "pattern": "^/"},
            "port": PORT_NUMBER,
            "insecureSkipVerify": {"type": "boolean"},
            "caCertPath": {"type": "string"},
            "clientCertPath": {"type": "string"},
            "clientKeyPath": {"type": "string"},
            "interval": {"type": "string"},
        },
        [],
    ),
    "core-metrics-extractor": _object(
        {
            "engineLabelKey": {"type": "string"},
            "defaultEngine": {"enum": ["vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm", "triton"]},
            "engineConfigs": {"type": "array", "items": {"type": "object"}},
        },
        [],
    ),
}
_SCORERS = ("queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "lora-affinity-scorer")
ENDPOINT_PICKER_CONFIG = _object(
    {
        "apiVersion": {"const": "llm-d.ai/v1alpha1"},
        "kind": {"const": "EndpointPickerConfig"},
        # Gate names, each optionally "=true" or "=false".
        "featureGates": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9-]*(=(true|false))?$"},
        },
        "plugins": {
            "type": "array",
            "items": {
                "oneOf": [
                    _object({"type": {"enum": list(_SCORERS)}, "name": {"type": "string"}}, ["type"]),
                    *(
                        _object(
                            {"type": {"const": kind}, "name": {"type": "string"}, "parameters": params},
                            ["type"],
                        )
                        for kind, params in _PLUGIN_PARAMETERS.items()
                    ),
                ]
            },
        },
        "schedulingProfiles": {
            "type": "array",
            "items": _object(
                {
                    "name": {"type": "string"},
                    "plugins": {
                        "type": "array",
                        "items": _object(
                            {"pluginRef": {"type": "string"}, "weight": {"type": "number", "minimum": 0}},
                            ["pluginRef"],
                        ),
                    },
                },
                ["name", "plugins"],
            ),
        },
    },
    ["apiVersion", "kind", "plugins"],
)

BY_API_VERSION: dict[str, dict[str, Any]] = {
    "inference.networking.k8s.io/v1": INFERENCE_POOL,
    "llm-d.ai/v1alpha2": INFERENCE_OBJECTIVE,
    "gateway.networking.k8s.io/v1": HTTP_ROUTE,
}
