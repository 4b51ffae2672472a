"""One adapter per engine: everything that differs between vLLM, SGLang and a custom engine.

``base`` defines what an adapter answers, each other module here is one engine and defines
``ADAPTER``, and ``registry`` finds them. Rendering and planning ask the adapter; none of them
branches on ``spec.engine.type`` (docs/engines.md: adding an engine).
"""
