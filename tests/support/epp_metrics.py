"""/metrics read as an Inference Gateway endpoint picker (EPP) reads a model server's: a small port of
llm-d/llm-d-router's core metrics extractor (pkg/epp/framework/plugins/datalayer/extractor/metrics/:
factories.go for the engine types' metric specs, spec.go and loraspec.go for spec parsing and the
newest-sample rules, extractor.go for what is taken from each), as read at commit
ebab687927f5331c1b39defcb579a07951bce56c (the same rules as its v0.10.0 release, 71f4f099).

Written from those files' behaviour, not their code: a spec is `name` or `name{label=value,...}`
(values quoted or not); among the series of a family whose labels match, the one with the newest
timestamp wins (no timestamp counts as 0, the first of equals wins); for the LoRA spec the series
with the largest value wins (its value is a timestamp). A series' value is read from gauges and
counters only (an untyped, histogram or summary series reads 0). A spec that matches nothing is an
error the EPP logs, and the metric keeps its previous value (here: None); an absent LoRA family is
no error. The EPP parses the exposition with prometheus/common's text parser (legacy name
validation, source/metrics/datasource.go), which refuses the whole scrape on a second HELP or TYPE
line for a family, a TYPE after the family's samples, an unknown type or a name that is not a legacy
metric name: then nothing is read (here: every metric None, the parse error in `errors`).

    python -m tests.support.epp_metrics http://127.0.0.1:9000/metrics [--engine vllm]

prints what the EPP would take from a running server, as JSON, and exits 1 when a metric the
engine type reads is missing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class EngineSpecs:
    """One engine type's metric specs (factories.go's engineConfigParams)."""

    queued: str
    running: str
    kv_usage: str = ""
    lora: str = ""
    cache_info: str = ""
    block_size_label: str = "block_size"
    num_blocks_label: str = "num_gpu_blocks"
    block_size: str = ""
    num_blocks: str = ""


# The built-in engine types (factories.go defaultEngineConfigs); `vllm` is the default.
ENGINES: dict[str, EngineSpecs] = {
    "vllm": EngineSpecs(
        queued="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        kv_usage="vllm:kv_cache_usage_perc",
        lora="vllm:lora_requests_info",
        cache_info="vllm:cache_config_info",
    ),
    "sglang": EngineSpecs(
        queued="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        kv_usage="sglang:token_usage",
        cache_info="sglang:cache_config_info",
        block_size_label="page_size",
        num_blocks_label="num_pages",
    ),
    "trtllm-serve": EngineSpecs(
        queued="trtllm_num_requests_waiting",
        running="trtllm_num_requests_running",
        kv_usage="trtllm_kv_cache_utilization",
        block_size="trtllm_kv_cache_tokens_per_block",
        num_blocks="trtllm_kv_cache_max_blocks",
    ),
    "triton-tensorrt-llm": EngineSpecs(
        queued="nv_trt_llm_request_metrics{request_type=waiting}",
        running="nv_trt_llm_request_metrics{request_type=scheduled}",
        kv_usage="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
        block_size="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}",
        num_blocks="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}",
    ),
    # Triton's own metrics, for non-LLM models (no KV cache, no LoRA).
    "triton": EngineSpecs(queued="nv_inference_pending_request_count", running="nv_inference_exec_count"),
}
# The pod label naming a pod's engine type, and the Gateway API Inference Extension's older one.
ENGINE_LABEL = "llm-d.ai/engine-type"
LEGACY_ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
# The LoRA labels (extractor.go).
RUNNING_ADAPTERS = "running_lora_adapters"
WAITING_ADAPTERS = "waiting_lora_adapters"
MAX_LORA = "max_lora"

_SPEC = re.compile(r"^\s*(\S+?)\s*(?:\{([^}]*)\})?\s*$")
_PAIR = re.compile(r'^\s*(\S+?)\s*=\s*"([^"]*)"\s*$')
_UNQUOTED = re.compile(r'(\w+)\s*=\s*([^",}\s]+)')
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class Spec:
    name: str
    labels: dict[str, str]

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels.items())


def parse_spec(text: str) -> Spec | None:
    """`name{label=value,...}` -> Spec; "" -> None (the metric is not read); ValueError if malformed."""
    if not text:
        return None
    match = _SPEC.match(_UNQUOTED.sub(r'\1="\2"', text))
    if match is None or not _METRIC_NAME.match(match.group(1)):
        raise ValueError(f"not a valid metric specification: {text!r}")
    labels: dict[str, str] = {}
    block = (match.group(2) or "").strip()
    if block:
        for pair in block.split(","):
            found = _PAIR.match(pair)
            if found is None or not _LABEL_NAME.match(found.group(1)):
                raise ValueError(f"invalid label pair {pair!r} in specification: {text!r}")
            labels[found.group(1)] = found.group(2)
    return Spec(match.group(1), labels)


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    timestamp_ms: int  # 0 when the exposition gives none


Families = dict[str, list[Sample]]


# The type names the Go parser knows (client_model's MetricType, upper-cased).
_TYPES = {"counter", "gauge", "summary", "untyped", "histogram", "gauge_histogram"}


def check_exposition(text: str) -> str | None:
    """The text parser's refusals that prometheus_client's lenient parser lets through: the error
    that makes the EPP drop the whole scrape, or None."""
    helped: set[str] = set()
    typed: set[str] = set()
    sampled: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        at = f"text format parsing error in line {number}:"
        words = line.split(None, 3)
        if len(words) >= 3 and words[0] == "#" and words[1] in ("HELP", "TYPE"):
            name = words[2]
            if not _METRIC_NAME.match(name):
                return f"{at} invalid metric name in comment"
            if words[1] == "HELP":
                if name in helped:
                    return f'{at} second HELP line for metric name "{name}"'
                helped.add(name)
                continue
            if name in typed or name in sampled:
                return f'{at} second TYPE line for metric name "{name}", or TYPE reported after samples'
            if len(words) < 4 or words[3].strip().lower() not in _TYPES:
                return f"{at} unknown metric type"
            typed.add(name)
        elif line.strip() and not line.lstrip().startswith("#"):
            name = re.split(r"[\s{]", line.strip(), maxsplit=1)[0]
            if not _METRIC_NAME.match(name):
                return f"{at} invalid metric name"
            sampled.add(name)
    return None


def _declared(text: str) -> dict[str, str]:
    """Family names as the TYPE lines give them (the Go parser keys counters by the declared name;
    prometheus_client renames a counter's samples to NAME_total)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 4 and words[:2] == ["#", "TYPE"]:
            found[words[2]] = words[3].lower()
    return found


def parse_exposition(text: str) -> Families:
    """Prometheus text -> samples by family name, each with the value the extractor reads
    (spec.go's extractValue: a gauge's or counter's value, else 0)."""
    declared = _declared(text)
    families: Families = {}
    for family in text_string_to_metric_families(text):
        name = family.name
        if family.type == "counter":
            name = name + "_total" if declared.get(name + "_total") == "counter" else name
        for sample in family.samples:
            if family.type == "counter" and sample.name != family.name + "_total":
                continue  # a counter's _created sample
            value = float(sample.value) if family.type in ("gauge", "counter") else 0.0
            ts = sample.timestamp
            millis = int(float(ts) * 1000) if ts is not None else 0
            families.setdefault(name, []).append(Sample(dict(sample.labels), value, millis))
    return families


def newest(spec: Spec, families: Families) -> Sample:
    """The matching series with the newest timestamp (spec.go's getLatestMetric)."""
    samples = families.get(spec.name)
    if not samples:
        raise LookupError(f"metric family {spec.name!r} not found")
    latest, recent = None, -1
    for sample in samples:
        if spec.matches(sample.labels) and sample.timestamp_ms > recent:
            latest, recent = sample, sample.timestamp_ms
    if latest is None:
        raise LookupError(f"no matching metric found for {spec.name!r} with labels {spec.labels}")
    return latest


def newest_lora(spec: Spec, families: Families) -> Sample | None:
    """The matching LoRA series with the largest value, its time (loraspec.go); None: none (no error)."""
    latest, recent = None, -1.0
    for sample in families.get(spec.name, []):
        if spec.matches(sample.labels) and sample.value > recent:
            latest, recent = sample, sample.value
    return latest


def _adapters(text: str) -> set[str]:
    return {name.strip() for name in text.split(",") if name.strip()}


@dataclass
class EndpointMetrics:
    """What the extractor stores for an endpoint (None: not read, the EPP keeps what it had)."""

    waiting_queue_size: int | None = None
    running_requests_size: int | None = None
    kv_cache_usage_percent: float | None = None
    active_models: set[str] | None = None
    waiting_models: set[str] | None = None
    max_active_models: int | None = None
    cache_block_size: int | None = None
    cache_num_blocks: int | None = None
    errors: list[str] = field(default_factory=list)


def _atoi(text: str, errors: list[str], keep: int | None) -> int | None:
    """A label as Go's strconv.Atoi reads it (sign and digits only); on an error the EPP logs it and
    keeps what it had."""
    if re.fullmatch(r"[+-]?[0-9]+", text):
        return int(text)
    errors.append(f'strconv.Atoi: parsing "{text}": invalid syntax')
    return keep


def extract(text: str, engine: str = "vllm") -> EndpointMetrics:
    specs = ENGINES[engine]
    out = EndpointMetrics()
    refused = check_exposition(text)
    if refused is not None:
        out.errors.append(refused)
        return out
    families = parse_exposition(text)

    def read(spec_text: str) -> Sample | None:
        spec = parse_spec(spec_text)
        if spec is None:
            return None
        try:
            return newest(spec, families)
        except LookupError as exc:
            out.errors.append(str(exc))
            return None

    if (sample := read(specs.queued)) is not None:
        out.waiting_queue_size = int(sample.value)
    if (sample := read(specs.running)) is not None:
        out.running_requests_size = int(sample.value)
    if (sample := read(specs.kv_usage)) is not None:
        out.kv_cache_usage_percent = sample.value
    lora_spec = parse_spec(specs.lora)
    if lora_spec is not None and (sample := newest_lora(lora_spec, families)) is not None:
        out.active_models = _adapters(sample.labels.get(RUNNING_ADAPTERS, ""))
        out.waiting_models = _adapters(sample.labels.get(WAITING_ADAPTERS, ""))
        if sample.labels.get(MAX_LORA):
            out.max_active_models = _atoi(sample.labels[MAX_LORA], out.errors, out.max_active_models)
    if (sample := read(specs.cache_info)) is not None:
        size = sample.labels.get(specs.block_size_label, "")
        blocks = sample.labels.get(specs.num_blocks_label, "")
        out.cache_block_size = _atoi(size, out.errors, 0) if size else 0
        if blocks:
            out.cache_num_blocks = _atoi(blocks, out.errors, out.cache_num_blocks)
    if (sample := read(specs.block_size)) is not None:
        out.cache_block_size = int(sample.value)
    if (sample := read(specs.num_blocks)) is not None:
        out.cache_num_blocks = int(sample.value)
    return out


def read_url(url: str, engine: str = "vllm", timeout_s: float = 10.0) -> EndpointMetrics:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return extract(response.read().decode(), engine)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Read /metrics as the Inference Gateway EPP does.")
    parser.add_argument("url", help="the model server's metrics URL, e.g. http://127.0.0.1:9000/metrics")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm", help="the pod's engine type")
    args = parser.parse_args(argv)
    found = read_url(args.url, args.engine)
    shown: dict[str, Any] = {k: sorted(v) if isinstance(v, set) else v for k, v in asdict(found).items()}
    print(json.dumps(shown, indent=2))
    return 1 if found.errors else 0


if __name__ == "__main__":
    sys.exit(main())
