"""Model-library integrations, above ``kvcache.prefix``; each is imported on its own.

- ``transformers``  Hugging Face ``*ForCausalLM`` models: save and load
                    ``DynamicCache`` objects, and ``generate`` with prefix reuse
                    (needs ``pip install 'kvcache[transformers]'``)
- ``llama_cpp``     llama-cpp-python: ``PoolCache``, a prompt cache of whole
                    ``Llama`` states shared by every process on the machine
                    (needs ``pip install 'kvcache[llama-cpp]'``)
- ``gguf_model``    writes a tiny random-weight Llama as GGUF (tests, benchmark)

Both engines' caches sit on ``kvcache.prefix``'s keys, namespaces and checks:
transformers hands over KV per token, so it stores chunks (``PrefixCache``);
llama.cpp saves whole states, so it stores states found by prefix markers
(``StateCache``).

Nothing here is imported by ``import kvcache``: torch takes seconds to import.
"""
