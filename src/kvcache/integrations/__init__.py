"""Model-library integrations, above ``kvcache.prefix``; each is imported on its own.

- ``transformers``  Hugging Face ``*ForCausalLM`` models: save and load
                    ``DynamicCache`` objects, and ``generate`` with prefix reuse
                    (needs ``pip install 'kvcache[transformers]'``)
- ``llama_cpp``     llama-cpp-python: ``PoolCache``, a prompt cache of whole
                    ``Llama`` states shared by every process on the machine
                    (needs ``pip install 'kvcache[llama-cpp]'``)
- ``gguf_model``    writes a tiny random-weight Llama as GGUF (tests, benchmark)
- ``vllm``          vLLM 0.32: ``KVCacheConnector``, a v1 KV connector that loads
                    and stores prompt prefixes' KV in a pool (its own venv: vLLM
                    pins its torch; see docs/vllm.md)

The engines' caches sit on ``kvcache.prefix``'s keys, namespaces and checks:
transformers and vLLM hand over KV per token, so they store chunks (``PrefixCache``);
llama.cpp saves whole states, so it stores states found by prefix markers
(``StateCache``).

Nothing here is imported by ``import kvcache``: torch takes seconds to import.
"""
