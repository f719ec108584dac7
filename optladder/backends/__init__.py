"""One interface over every engine under test: the reference engine (in process, or behind its own
HTTP server), vLLM (`vllm serve`), transformers, and any OpenAI-compatible endpoint.

Imports run one way: backends -> serving / traffic -> engine; the engine never imports from here.
"""
from optladder.backends.engines import Backend, make_backend

__all__ = ["Backend", "make_backend"]
