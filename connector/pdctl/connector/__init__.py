"""Code that runs inside vLLM processes (KV connector extensions, NIXL push engine).

It may import vllm, nixl and torch; it shares only plain data formats with the SDK.
"""
