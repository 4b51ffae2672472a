"""NOT SGLang: a stand-in package that exists only in the reference-engine image.

A local pod runner puts ``pdd_refengine/image/python`` on PYTHONPATH (a Dockerfile target copies
it into site-packages), so the command the operator renders for SGLang, ``python3 -m
sglang.launch_server ...``, starts ``pdd_refengine`` (a test double of the engine) in SGLang mode.
"""
