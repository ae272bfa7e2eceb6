"""Model-library integrations, above ``kvcache.prefix``; each is imported on its own.

- ``transformers``  Hugging Face ``*ForCausalLM`` models: save and load
                    ``DynamicCache`` objects, and ``generate`` with prefix reuse
                    (needs ``pip install 'kvcache[transformers]'``)

Nothing here is imported by ``import kvcache``: torch takes seconds to import.
"""
