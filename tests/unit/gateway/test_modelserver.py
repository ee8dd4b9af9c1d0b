"""The model-server metrics' parts: Triton's metrics text summed per model, the collector's series,
and the test reader's port of the endpoint picker's spec rules (so that what the other tests
read is what the EPP would)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway import reference
from gateway.modelserver import FAMILIES, EngineLoad, ModelLoad, ModelServerCollector, ServedEngine
from gateway.triton.metrics import parse
from tests.support import epp_metrics


def _triton(model: str, waiting: int, used: int, total: int, extra: str = "") -> str:
    kv = "nv_trt_llm_kv_cache_block_metrics"
    blocks = {"used": used, "max": total, "tokens_per": 64, "fraction": used / total}
    return (
        "# TYPE nv_trt_llm_request_metrics gauge\n"
        f'nv_trt_llm_request_metrics{{model="{model}",request_type="waiting",version="1"}} {waiting}\n'
        f'nv_trt_llm_request_metrics{{model="{model}",request_type="scheduled",version="1"}} 2\n'
        f"# TYPE {kv} gauge\n"
        + "".join(
            f'{kv}{{kv_cache_block_type="{kind}",model="{model}",version="1"}} {value}\n'
            for kind, value in blocks.items()
        )
        + extra
    )


def test_triton_text_is_summed_per_model_over_endpoints() -> None:
    other = '# TYPE nv_inference_count counter\nnv_inference_count_total{model="encoder",version="1"} 3\n'
    loads = parse([_triton("tensorrt_llm", 2, 10, 100, other), _triton("tensorrt_llm", 1, 50, 100)])
    assert set(loads) == {"tensorrt_llm"}, "a model without the TensorRT-LLM families reports nothing"
    load = loads["tensorrt_llm"]
    assert load.waiting == 3 and load.kv_max_blocks == 200 and load.tokens_per_block == 64
    assert load.kv_usage == pytest.approx(0.3)


def test_kv_usage_falls_back_to_the_fraction_and_stays_in_range() -> None:
    assert EngineLoad(kv_fraction=0.4).kv_usage == 0.4
    assert EngineLoad(kv_used_blocks=12, kv_max_blocks=10).kv_usage == 1.0
    assert EngineLoad().kv_usage is None


class _Loads:
    def __init__(self, loads: dict[str, EngineLoad]) -> None:
        self._loads = loads

    async def refresh(self) -> None: ...

    def loads(self) -> dict[str, EngineLoad]:
        return self._loads

    async def close(self) -> None: ...


def _exposition(collector: ModelServerCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_one_series_per_served_model_each_with_its_engines_load() -> None:
    keys = {"a": ("a", None), "b": ("b", None), "b-lora": ("b", "b-lora")}
    load = ModelLoad(keys.get)
    for model in ("a", "b", "b-lora", "b-lora"):
        key = load.key(model)
        assert key is not None
        load.running(key, 1)
    load.queued(("a", None), 1)
    assert load.key("missing") is None and load.key(None) is None
    engines = _Loads(
        {
            "trt-a": EngineLoad(waiting=1, kv_used_blocks=5, kv_max_blocks=10, tokens_per_block=32),
            "trt-b": EngineLoad(waiting=0, kv_fraction=0.1),
        }
    )
    served = [ServedEngine("a", ("trt-a",)), ServedEngine("b", ("ensemble", "trt-b"), lora=True)]
    text = _exposition(ModelServerCollector(load, lambda: served, engines, max_lora=None))
    assert 'vllm:num_requests_waiting{model_name="a"} 2.0' in text
    assert 'vllm:num_requests_running{model_name="a"} 0.0' in text, "its one request waits in the engine"
    assert 'vllm:num_requests_running{model_name="b"} 3.0' in text
    assert 'vllm:kv_cache_usage_perc{model_name="a"} 0.5' in text
    assert 'vllm:kv_cache_usage_perc{model_name="b"} 0.1' in text
    assert 'vllm:cache_config_info{block_size="32",model_name="a",num_gpu_blocks="10"} 1.0' in text
    assert 'model_name="b"' not in "".join(line for line in text.splitlines() if "cache_config_info{" in line)
    (lora,) = [line for line in text.splitlines() if line.startswith("vllm:lora_requests_info{")]
    assert 'max_lora=""' in lora and 'running_lora_adapters="b-lora"' in lora and 'model_name="b"' in lora


def test_the_metrics_reference_lists_the_model_server_families() -> None:
    table = reference.metrics_table()
    for name in FAMILIES:
        assert f"| `{name}` | gauge |" in table


# --- the reader's port of the EPP's rules --------------------------------------------------------


def test_specs_parse_as_the_epp_parses_them() -> None:
    spec = epp_metrics.parse_spec('nv_trt_llm_request_metrics{request_type=waiting, model="x"}')
    assert spec == epp_metrics.Spec("nv_trt_llm_request_metrics", {"request_type": "waiting", "model": "x"})
    assert epp_metrics.parse_spec("") is None
    for bad in ("1bad", "m{=x}", "m{a b}"):
        with pytest.raises(ValueError):
            epp_metrics.parse_spec(bad)


def test_the_newest_sample_wins_and_the_first_of_equals() -> None:
    text = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="a"} 1\n'
        'vllm:num_requests_waiting{model_name="b"} 2\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="a"} 1 1000\n'
        'vllm:num_requests_running{model_name="b"} 7 3000\n'
        'vllm:num_requests_running{model_name="c"} 9 2000\n'
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="x, y",waiting_lora_adapters=""} 50\n'
        'vllm:lora_requests_info{max_lora="3",running_lora_adapters="z",waiting_lora_adapters="w"} 90\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="v",waiting_lora_adapters=""} 70\n'
    )
    found = epp_metrics.extract(text)
    assert found.waiting_queue_size == 1 and found.running_requests_size == 7
    assert found.active_models == {"z"} and found.waiting_models == {"w"} and found.max_active_models == 3
    assert "metric family 'vllm:kv_cache_usage_perc' not found" in found.errors
    triton = epp_metrics.extract(_triton("tensorrt_llm", 4, 25, 100), engine="triton-tensorrt-llm")
    assert (triton.waiting_queue_size, triton.running_requests_size) == (4, 2)
    assert triton.kv_cache_usage_percent == 0.25
    assert (triton.cache_block_size, triton.cache_num_blocks) == (64, 100)


# --- the settings ---------------------------------------------------------------------------------


def test_objective_priorities_and_triton_metrics_urls_parse_from_flags_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic import ValidationError

    from gateway.config import Settings

    assert Settings(objective_priorities="interactive=10, batch=-10").objective_priorities == {
        "interactive": 10,
        "batch": -10,
    }
    monkeypatch.setenv("GATEWAY_OBJECTIVE_PRIORITIES", '{"a": 3}')
    monkeypatch.setenv("GATEWAY_TRITON_METRICS_URL", "http://t-0:8002/metrics,http://t-1:8002/metrics")
    settings = Settings()
    assert settings.objective_priorities == {"a": 3}
    assert settings.triton_metrics_url == ["http://t-0:8002/metrics", "http://t-1:8002/metrics"]
    for bad in ({"objective_priorities": "interactive"}, {"objective_priorities": "a=high"}):
        with pytest.raises(ValidationError):
            Settings(**bad)
    with pytest.raises(ValidationError, match="expected http://HOST:PORT/metrics"):
        Settings(triton_metrics_url=["t-0:8002"])


def test_values_are_read_from_gauges_and_counters_only_and_counters_by_their_declared_name() -> None:
    text = (
        "vllm:num_requests_waiting 5\n"  # untyped: the EPP reads 0
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running 3\n"
        "# TYPE nv_inference_pending_request_count gauge\n"
        'nv_inference_pending_request_count{model="m",version="1"} 2\n'
        # Triton's counters keep the name their TYPE line gives (no _total).
        "# TYPE nv_inference_exec_count counter\n"
        'nv_inference_exec_count{model="m",version="1"} 7\n'
    )
    vllm = epp_metrics.extract(text)
    assert (vllm.waiting_queue_size, vllm.running_requests_size) == (0, 3)
    triton = epp_metrics.extract(text, engine="triton")
    assert (triton.waiting_queue_size, triton.running_requests_size) == (2, 7)
    assert triton.errors == []


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("# TYPE a gauge\na 1\n# TYPE a gauge\n", 'second TYPE line for metric name "a"'),
        ("a 1\n# TYPE a gauge\n", "or TYPE reported after samples"),
        ("# HELP a x\n# HELP a y\n", 'second HELP line for metric name "a"'),
        ("# TYPE a info\na 1\n", "unknown metric type"),
        ("a.b 1\n", "invalid metric name"),
    ],
)
def test_an_exposition_the_epps_text_parser_refuses_is_read_as_nothing(text: str, refusal: str) -> None:
    good = 'vllm:num_requests_waiting{model_name="a"} 1\n'
    found = epp_metrics.extract("# TYPE vllm:num_requests_waiting gauge\n" + good + text)
    assert found.waiting_queue_size is None and len(found.errors) == 1 and refusal in found.errors[0]


def test_integer_labels_are_read_as_go_reads_them() -> None:
    text = (
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="eight",running_lora_adapters="a",waiting_lora_adapters=""} 5\n'
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="1_6",num_gpu_blocks="+64"} 1\n'
    )
    found = epp_metrics.extract(text)
    assert found.active_models == {"a"} and found.max_active_models is None
    assert (found.cache_block_size, found.cache_num_blocks) == (0, 64)
    assert 'strconv.Atoi: parsing "eight": invalid syntax' in found.errors
    assert 'strconv.Atoi: parsing "1_6": invalid syntax' in found.errors
