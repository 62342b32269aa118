"""Bench-only (benches/bench_ttft.py puts this directory on the server's PYTHONPATH): when
``DTOK_TTFT_SWITCH=1``, dtok's vLLM plugin entry point also installs the per-request tokenizer
switch of :mod:`ttft_switch` after dtok's own hooks. Never part of dtok."""
import os

if os.environ.get("DTOK_TTFT_SWITCH") == "1":
    try:
        import dtok.integrations.vllm as _plugin

        _register = _plugin.register

        def register():
            _register()
            import ttft_switch

            ttft_switch.install()

        _plugin.register = register
    except Exception as exc:  # noqa: BLE001 - the bench then fails loudly on its first request
        print(f"ttft_switch: not installed: {type(exc).__name__}: {exc}", flush=True)
