"""deploy/grafana: the dashboard is valid Grafana dashboard JSON and queries only metrics that exist.

The structure is checked against a JSON schema written from Grafana's classic dashboard model
(`@grafana/schema` 13.2.3, `raw/dashboard/x/types.gen.ts`: Dashboard, Panel, RowPanel, GridPos,
VariableModel, DataSourceRef), narrowed to what this dashboard uses. Every PromQL expression is
tokenized and each metric name it selects must be one the gateway registers (read from a live
`GatewayMetrics().registry`, so renaming a gateway metric fails here) or one Triton documents.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gateway.metrics import GatewayMetrics

REPO = Path(__file__).resolve().parents[3]
GRAFANA = REPO / "deploy" / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
DASHBOARD = DASHBOARDS / "trtllm-gateway.json"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yaml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "trtllm-gateway.yaml"
COMPOSE = REPO / "deploy" / "compose.yaml"
PROMETHEUS = REPO / "deploy" / "prometheus.yml"

# Grafana's dashboard schema version in @grafana/schema 13.2.3 (`defaultDashboard.schemaVersion`) and
# in apps/dashboard/pkg/migration/schemaversion/migrations.go (LATEST_VERSION) of grafana/grafana.
SCHEMA_VERSION = 42
DATASOURCE_VARIABLE = "datasource"
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}

# Triton's metric names, as documented. Triton exports its counters without a `_total` suffix.
TRITON_METRICS = frozenset(
    {
        # triton-inference-server/server, docs/user_guide/metrics.md: "Inference Request Metrics"
        # (Counts, Latencies > Counters), "GPU Metrics" and "CPU Metrics" tables.
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_pending_request_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
        # triton-inference-server/tensorrtllm_backend, README.md "Triton Metrics", and the families
        # created in inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc
        # (labels request_type, memory_type, kv_cache_block_type, inflight_batcher_specific_metric).
        "nv_trt_llm_request_metrics",
        "nv_trt_llm_runtime_memory_metrics",
        "nv_trt_llm_kv_cache_block_metrics",
        "nv_trt_llm_inflight_batcher_metrics",
        "nv_trt_llm_general_metrics",
    }
)

# Sample names each metric type puts on the wire (prometheus_client appends `_total` to counters).
SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}


def gateway_metric_families() -> dict[str, tuple[str, ...]]:
    """Family name -> the sample names it is scraped as, from a fresh registry."""
    families = {}
    for family in GatewayMetrics().registry.collect():
        families[family.name] = tuple(family.name + suffix for suffix in SAMPLE_SUFFIXES[family.type])
    return families


GATEWAY_FAMILIES = gateway_metric_families()
GATEWAY_METRICS = frozenset(itertools.chain.from_iterable(GATEWAY_FAMILIES.values()))


# --- A small PromQL tokenizer ----------------------------------------------------------------------

TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<variable>\$\{[^}]*\}|\$\w+|\[\[\w+\]\])
  | (?P<number>(?:\d+(?:ms|[smhdwy]))+|0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<identifier>[A-Za-z_:][\w:]*)
  | (?P<punct>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){}\[\],@:])
    """,
    re.VERBOSE,
)
AGGREGATIONS = frozenset([
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio",
])  # fmt: skip
# Each is followed by a parenthesized list of label names, not of expressions.
LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = frozenset({"and", "or", "unless", "atan2", "bool", "offset", "inf", "nan"})
# From the Prometheus documentation (prometheus/prometheus, docs/querying/functions.md).
FUNCTIONS = frozenset([
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor",
    "histogram_avg", "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev",
    "histogram_stdvar", "histogram_sum", "holt_winters", "double_exponential_smoothing", "hour", "idelta",
    "increase", "irate", "label_join", "label_replace", "ln", "log2", "log10", "minute", "month",
    "predict_linear", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sort_by_label",
    "sort_by_label_desc", "sqrt", "time", "timestamp", "vector", "year", "avg_over_time", "min_over_time",
    "max_over_time", "sum_over_time", "count_over_time", "quantile_over_time", "stddev_over_time",
    "stdvar_over_time", "last_over_time", "present_over_time", "mad_over_time", "acos", "acosh", "asin",
    "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh", "deg", "pi", "rad", "start", "end",
])  # fmt: skip


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        match = TOKEN.match(expr, pos)
        assert match, f"cannot tokenize {expr[pos:]!r} in {expr!r}"
        if match.lastgroup != "space":
            out.append((match.lastgroup or "", match.group()))
        pos = match.end()
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions, keywords or labels."""
    toks = tokens(expr)
    names: set[str] = set()
    braces = brackets = 0
    skip_label_list = False
    for i, (kind, text) in enumerate(toks):
        following = toks[i + 1][1] if i + 1 < len(toks) else ""
        if text == "{":
            braces += 1
        elif text == "}":
            braces -= 1
        elif text == "[":
            brackets += 1
        elif text == "]":
            brackets -= 1
        elif skip_label_list:
            # Inside `by (...)`, `on (...)` and the like: label names up to the closing parenthesis.
            if text == ")":
                skip_label_list = False
            else:
                assert kind == "identifier" or text in "(,", f"not a label list in {expr!r}"
        elif kind != "identifier" or braces or brackets:
            continue  # label names and values, durations, numbers, operators
        elif text in LABEL_LIST_KEYWORDS:
            skip_label_list = following == "("
        elif text in AGGREGATIONS or text in KEYWORDS:
            continue
        elif following == "(":
            assert text in FUNCTIONS, f"unknown PromQL function {text!r} in {expr!r}"
        else:
            names.add(text)
    assert braces == brackets == 0 and not skip_label_list, f"unbalanced {expr!r}"
    return names


LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[A-Za-z_]\w*)\)$")


def variable_query_metrics(query: str) -> set[str]:
    """Grafana's Prometheus variable query `label_values(selector, label)`."""
    match = LABEL_VALUES.match(query.strip())
    assert match, f"unsupported variable query {query!r}"
    return metric_names(match.group("selector"))


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('sum by (le) (rate(a_bucket{model=~"$model"}[$__rate_interval]))', {"a_bucket"}),
        ("histogram_quantile(0.99, sum by (le, model) (rate(a_bucket[5m])))", {"a_bucket"}),
        ("sum(rate(a_sum[1m])) / sum(rate(a_count[1m]))", {"a_sum", "a_count"}),
        ('a{x="by (y)", z!~"sum(b)"} offset 1h30m', {"a"}),
        ("a / on (x) group_left (y) b and ignoring(z) c", {"a", "b", "c"}),
        ("max without (pid) (a) > bool 0.5e1", {"a"}),
        ("topk(3, a:recorded:rate5m)", {"a:recorded:rate5m"}),
        ("max_over_time(a[1h:5m]) @ end()", {"a"}),
    ],
)
def test_tokenizer_finds_the_metric_names_of_an_expression(expr: str, expected: set[str]) -> None:
    assert metric_names(expr) == expected


def test_tokenizer_rejects_unknown_functions() -> None:
    with pytest.raises(AssertionError, match="unknown PromQL function"):
        metric_names("rated(a[1m])")


# --- The dashboard ---------------------------------------------------------------------------------

PANEL_TYPES = [
    "timeseries", "stat", "gauge", "bargauge", "barchart", "table", "text", "heatmap", "histogram",
    "piechart", "state-timeline", "status-history",
]  # fmt: skip
VARIABLE_TYPES = [
    "query", "adhoc", "groupby", "constant", "datasource", "interval", "textbox", "custom", "system",
    "snapshot", "switch",
]  # fmt: skip
# Field names of Grafana's Panel, RowPanel, Dashboard and VariableModel: anything else is a typo.
PANEL_KEYS = [
    "type", "id", "title", "description", "datasource", "gridPos", "targets", "fieldConfig", "options",
    "transparent", "links", "repeat", "repeatDirection", "maxPerRow", "maxDataPoints", "interval",
    "timeFrom", "timeShift", "hideTimeOverride", "transformations", "pluginVersion", "cacheTimeout",
    "queryCachingTTL", "libraryPanel", "timeCompare",
]  # fmt: skip
DASHBOARD_KEYS = [
    "id", "uid", "title", "description", "tags", "editable", "graphTooltip", "timezone",
    "fiscalYearStartMonth", "liveNow", "refresh", "time", "timepicker", "schemaVersion", "version", "links",
    "annotations", "templating", "panels", "weekStart", "gnetId", "revision", "preload",
]  # fmt: skip
VARIABLE_KEYS = [
    "name", "label", "description", "type", "datasource", "query", "definition", "refresh", "sort",
    "includeAll", "multi", "allValue", "current", "hide", "regex", "options", "skipUrlSync",
    "allowCustomValue",
]  # fmt: skip
# Query fields of Grafana's Prometheus data source.
TARGET_KEYS = [
    "refId", "datasource", "expr", "legendFormat", "range", "instant", "editorMode", "format", "interval",
    "intervalFactor", "exemplar", "hide", "step",
]  # fmt: skip

DATASOURCE_SCHEMA = {"const": DATASOURCE_REF}
GRID_POS = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "additionalProperties": False,
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
        "static": {"type": "boolean"},
    },
}
TARGET = {
    "type": "object",
    "required": ["refId", "expr", "datasource"],
    "additionalProperties": False,
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "expr": {"type": "string", "minLength": 1},
        "datasource": DATASOURCE_SCHEMA,
        "legendFormat": {"type": "string"},
        **{key: {} for key in TARGET_KEYS if key not in {"refId", "expr", "datasource", "legendFormat"}},
    },
}
PANEL = {
    "type": "object",
    "required": ["type", "id", "title", "gridPos", "datasource", "targets", "fieldConfig", "options"],
    "additionalProperties": False,
    "properties": {
        **{key: {} for key in PANEL_KEYS},
        "type": {"enum": PANEL_TYPES},
        "id": {"type": "integer", "minimum": 1},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "datasource": DATASOURCE_SCHEMA,
        "gridPos": GRID_POS,
        "targets": {"type": "array", "minItems": 1, "items": TARGET},
        "fieldConfig": {
            "type": "object",
            "required": ["defaults", "overrides"],
            "properties": {"defaults": {"type": "object"}, "overrides": {"type": "array"}},
        },
        "options": {"type": "object"},
    },
}
ROW = {
    "type": "object",
    "required": ["type", "id", "title", "collapsed", "panels", "gridPos"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "row"},
        "id": {"type": "integer", "minimum": 1},
        "title": {"type": "string", "minLength": 1},
        # Expanded rows keep their panels at the top level; only collapsed rows nest them.
        "collapsed": {"const": False},
        "panels": {"type": "array", "maxItems": 0},
        "gridPos": {
            **GRID_POS,
            "properties": {**GRID_POS["properties"], "h": {"const": 1}, "w": {"const": 24}},
        },
        "datasource": DATASOURCE_SCHEMA,
        "repeat": {"type": "string"},
    },
}
VARIABLE = {
    "type": "object",
    "required": ["name", "type", "query"],
    "additionalProperties": False,
    "properties": {
        **{key: {} for key in VARIABLE_KEYS},
        "name": {"type": "string", "pattern": r"^[A-Za-z_]\w*$"},
        "type": {"enum": VARIABLE_TYPES},
        "datasource": DATASOURCE_SCHEMA,
        "refresh": {"enum": [0, 1, 2]},
        "hide": {"enum": [0, 1, 2, 3]},
        "query": {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "object",
                    "required": ["query", "refId"],
                    "properties": {"query": {"type": "string"}},
                },
            ]
        },
    },
}
DASHBOARD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time", "refresh", "tags"],
    "additionalProperties": False,
    "properties": {
        **{key: {} for key in DASHBOARD_KEYS},
        # Grafana: "string (8-40)", letters, digits, '-' and '_' (they end up in URLs).
        "uid": {"type": "string", "pattern": r"^[A-Za-z0-9_-]{8,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"const": SCHEMA_VERSION},
        "id": {"type": "null"},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "editable": {"type": "boolean"},
        "graphTooltip": {"enum": [0, 1, 2]},
        "refresh": {"type": "string", "pattern": r"^(\d+[smhd])?$"},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "templating": {
            "type": "object",
            "required": ["list"],
            "additionalProperties": False,
            "properties": {"list": {"type": "array", "items": VARIABLE}},
        },
        "annotations": {"type": "object", "properties": {"list": {"type": "array"}}},
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {"if": {"properties": {"type": {"const": "row"}}}, "then": ROW, "else": PANEL},
        },
    },
}


def load_dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expr) for every panel target."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield f"{panel['title']} / {target['refId']}", target["expr"]


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(DASHBOARD_SCHEMA)


def test_dashboard_matches_the_grafana_dashboard_schema() -> None:
    errors = sorted(
        jsonschema.Draft202012Validator(DASHBOARD_SCHEMA).iter_errors(load_dashboard()),
        key=lambda e: list(e.absolute_path),
    )
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])


def test_schema_rejects_what_grafana_would_not_load() -> None:
    validator = jsonschema.Draft202012Validator(DASHBOARD_SCHEMA)
    good = load_dashboard()
    panel_index = next(i for i, p in enumerate(good["panels"]) if p["type"] != "row")
    broken: list[dict[str, Any]] = []
    for mutate in (
        lambda d: d.pop("schemaVersion"),
        lambda d: d["panels"][panel_index].update(type="graph-typo"),
        lambda d: d["panels"][panel_index]["targets"][0].pop("expr"),
        lambda d: d["panels"][panel_index]["targets"][0].pop("refId"),
        lambda d: d["panels"][panel_index].update(datasource={"type": "prometheus", "uid": "abc"}),
        lambda d: d["panels"][panel_index]["gridPos"].update(w=25),
        lambda d: d["panels"][panel_index].update(gridpos={}),
    ):
        document = load_dashboard()
        mutate(document)
        broken.append(document)
    for document in broken:
        assert not validator.is_valid(document)


def test_panel_ids_are_unique_and_ref_ids_unique_within_a_panel() -> None:
    ids = [panel["id"] for panel in panels(load_dashboard())]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    for panel in panels(load_dashboard()):
        ref_ids = [t["refId"] for t in panel.get("targets", [])]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_panels_fit_the_24_column_grid_without_overlapping() -> None:
    boxes = [(p["title"], p["gridPos"]) for p in load_dashboard()["panels"]]
    for title, g in boxes:
        assert g["x"] + g["w"] <= 24, title
    for (a, ga), (b, gb) in itertools.combinations(boxes, 2):
        overlap_x = ga["x"] < gb["x"] + gb["w"] and gb["x"] < ga["x"] + ga["w"]
        overlap_y = ga["y"] < gb["y"] + gb["h"] and gb["y"] < ga["y"] + ga["h"]
        assert not (overlap_x and overlap_y), f"{a!r} overlaps {b!r}"


def test_rows_are_in_order_and_each_holds_panels() -> None:
    top = load_dashboard()["panels"]
    assert [p["gridPos"]["y"] for p in top] == sorted(p["gridPos"]["y"] for p in top)
    rows = [p["title"] for p in top if p["type"] == "row"]
    assert rows == [
        "Traffic",
        "Latency",
        "Tokens",
        "Reliability",
        "Triton",
        "Admission by priority",
        "Endpoints",
        "LoRA adapters",
    ]
    kinds = [p["type"] for p in top]
    assert kinds[0] == "row" and kinds[-1] != "row"
    assert all(not (a == b == "row") for a, b in itertools.pairwise(kinds)), "empty row"


def test_every_data_source_reference_is_the_templated_prometheus_variable() -> None:
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables[DATASOURCE_VARIABLE]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    references = [p["datasource"] for p in panels(dashboard) if p["type"] != "row"]
    references += [t["datasource"] for p in panels(dashboard) for t in p.get("targets", [])]
    references += [v["datasource"] for v in variables.values() if v["type"] == "query"]
    assert references and all(ref == DATASOURCE_REF for ref in references)
    # Nothing else in the file names a data source (e.g. a leftover `${DS_PROMETHEUS}` import input).
    text = DASHBOARD.read_text()
    assert set(re.findall(r"\$\{(\w+)", text)) <= {DATASOURCE_VARIABLE}
    assert "__inputs" not in dashboard


def test_model_variables_come_from_gateway_and_triton_labels() -> None:
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    assert variables["model"]["query"]["query"] == "label_values(gateway_requests_total, model)"
    assert variables["triton_model"]["query"]["query"] == "label_values(nv_inference_request_success, model)"
    for name in ("model", "triton_model"):
        assert variables[name]["definition"] == variables[name]["query"]["query"]
        # "All" must match every value in the `=~"$model"` matchers, including the empty one.
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"


def test_gateway_metrics_are_read_from_the_live_registry() -> None:
    # Guards the mapping from families to scraped names: a counter is scraped with `_total`.
    assert "gateway_requests_total" in GATEWAY_METRICS
    assert "gateway_requests" not in GATEWAY_METRICS
    assert "gateway_time_to_first_token_seconds_bucket" in GATEWAY_METRICS
    assert "gateway_requests_in_flight" in GATEWAY_METRICS


def test_every_query_names_only_metrics_the_gateway_or_triton_exports() -> None:
    dashboard = load_dashboard()
    known = GATEWAY_METRICS | TRITON_METRICS
    unknown = {}
    for where, expr in queries(dashboard):
        names = metric_names(expr)
        assert names, f"{where}: selects no metric: {expr!r}"
        if names - known:
            unknown[where] = sorted(names - known)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            names = variable_query_metrics(variable["query"]["query"])
            if names - known:
                unknown[f"variable {variable['name']}"] = sorted(names - known)
    assert not unknown, unknown


def test_every_gateway_metric_has_a_panel() -> None:
    used = set().union(*(metric_names(expr) for _, expr in queries(load_dashboard())))
    missing = [family for family, samples in GATEWAY_FAMILIES.items() if not used & set(samples)]
    assert not missing, f"gateway metrics without a panel: {missing}"


def test_quantiles_aggregate_buckets_by_le_and_counters_are_rates() -> None:
    for where, expr in queries(load_dashboard()):
        if "histogram_quantile" in expr:
            by_le = r"histogram_quantile\(0\.\d+, sum by \((?:[\w, ]*\b)?le\b[\w, ]*\) \(rate\("
            assert re.search(by_le, expr), where
        for name in metric_names(expr) & CUMULATIVE:
            assert re.search(rf"\b(rate|increase)\({name}\b", expr), f"{where}: {name} without rate()"


# Samples that only ever grow: gateway counters and histogram series, and Triton's documented
# counters (the "Count" and "Latency > Counters" tables); the rest are gauges.
CUMULATIVE = frozenset(
    sample
    for family in GatewayMetrics().registry.collect()
    if family.type in {"counter", "histogram"}
    for sample in GATEWAY_FAMILIES[family.name]
) | {
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
}  # fmt: skip


# --- Provisioning and Compose ----------------------------------------------------------------------


def grafana_service() -> dict[str, Any]:
    service: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    return service


def mounts() -> dict[str, str]:
    """Container path -> source directory on the host, for the Grafana service's bind mounts."""
    return {
        v["target"]: str((COMPOSE.parent / v["source"]).resolve())
        for v in grafana_service()["volumes"]
        if v["type"] == "bind"
    }


def test_datasource_provisioning_points_at_the_compose_prometheus() -> None:
    config = yaml.safe_load(DATASOURCES.read_text())
    assert config["apiVersion"] == 1
    (source,) = config["datasources"]
    assert (source["type"], source["url"], source["access"]) == (
        "prometheus",
        "http://prometheus:9090",
        "proxy",
    )
    assert source["isDefault"] is True
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert any(port.endswith(":9090") for port in services["prometheus"]["ports"])
    # $__rate_interval is at least four times this: it must be the real scrape interval.
    scrape = yaml.safe_load(PROMETHEUS.read_text())["global"]["scrape_interval"]
    assert source["jsonData"]["timeInterval"] == scrape


def test_dashboard_provider_loads_the_mounted_dashboards_folder() -> None:
    config = yaml.safe_load(PROVIDERS.read_text())
    assert config["apiVersion"] == 1
    (provider,) = config["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    assert mounts()[path] == str(DASHBOARDS.resolve())
    assert DASHBOARD.parent == DASHBOARDS


def test_grafana_is_an_optional_service_with_the_provisioning_mounted_read_only() -> None:
    service = grafana_service()
    assert service["profiles"] == ["observability"]
    assert service["image"] == "${GRAFANA_IMAGE:?set GRAFANA_IMAGE in deploy/.env}"
    assert mounts()["/etc/grafana/provisioning"] == str((GRAFANA / "provisioning").resolve())
    assert all(v["read_only"] is True for v in service["volumes"])
    assert service["depends_on"] == {"prometheus": {"condition": "service_started"}}
    assert service["ports"] == ["127.0.0.1:3000:3000"]
    home = service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    mount = next(target for target in mounts() if home.startswith(target + "/"))
    assert Path(mounts()[mount], home.removeprefix(mount + "/")) == DASHBOARD
