"""Load generator and benchmark for the gateway (and any OpenAI-compatible or Triton endpoint).

    python -m loadtest run --model tiny --base-url http://127.0.0.1:9000/v1 \\
        --endpoint chat --concurrency 1,16,64 --requests 200 --max-tokens 128 --ignore-eos
    python -m loadtest run --model tiny --rate 5,10 --duration 60 --dataset prompts.jsonl
    python -m loadtest run --target triton-grpc --base-url 127.0.0.1:8001 --model ensemble
    python -m loadtest run --target triton-http --base-url http://127.0.0.1:8000 --model ensemble
    python -m loadtest.bench [--quick] [--repeat N] [--targets grpc,gateway,...] [--soak]  # make bench

Results go to results/<...>/: results.json, summary.csv, requests.csv, latency_vs_throughput.png
(run) or bench.md, bench.csv, bench.json, plots (bench). The dataset format is in workload.py.
"""
