"""Any OpenAI-compatible endpoint as an engine under test, by engine.server.base_url and served_model_name.

We do not start or configure it: our opt switches are recorded as metadata describing the deployment,
with a warning that they describe, not configure, the server; `on` is unknown (None) in opts_effective.
The endpoint must accept token-id prompts on /v1/completions (vLLM, SGLang and our own server do), so
replays keep their exact lengths and quality prompts carry our chat template.
"""
from __future__ import annotations

import logging
import time

from optladder.backends.completions import EndpointError, get_json, greedy_completions
from optladder.backends.opt_map import METADATA, OptMapping, collect
from optladder.engine.config import EngineConfig, ModelConfig
from optladder.engine.opts import OPTS

log = logging.getLogger(__name__)
WARNING = ("engine=openai: the opts in this config DESCRIBE the remote server, they do not configure it; "
           "opts_effective records them as metadata (on=None), so check them against the deployment")


def split_base_url(url: str) -> str:
    """http://host:8000/v1 or http://host:8000 -> http://host:8000 (the replay driver adds /v1/...)."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


class OpenAIEndpoint:
    def __init__(self, model_cfg: ModelConfig, engine_cfg: EngineConfig):
        srv = engine_cfg.server
        if not srv.base_url:
            raise ValueError("engine=openai needs engine.server.base_url, e.g. "
                             "engine.server.base_url=http://127.0.0.1:8000/v1 (and engine.server.served_model_name)")
        self.url = split_base_url(srv.base_url)
        self.model = srv.served_model_name or model_cfg.name
        self.api_key = srv.api_key
        self.max_model_len = engine_cfg.max_model_len
        t0 = time.perf_counter()
        self.served = self._check_model()
        self.start_s = time.perf_counter() - t0
        log.warning(WARNING)
        self._effective = collect([
            OptMapping(name, bool(getattr(engine_cfg, spec.field)), METADATA, None,
                       "recorded from our config; the endpoint's own setting is unknown")
            for name, spec in OPTS.items()])[2]

    def _check_model(self) -> list[str]:
        """The endpoint must answer and serve our model: a wrong name fails here, not as N failed requests."""
        try:
            served = [m["id"] for m in get_json(self.url + "/v1/models", self.api_key).get("data", [])]
        except EndpointError as e:
            raise EndpointError(f"engine=openai: {self.url} does not answer /v1/models ({e}); check "
                                "engine.server.base_url") from None
        if served and self.model not in served:
            raise ValueError(f"engine.server.served_model_name={self.model!r} is not served at {self.url}; "
                             f"valid: {served}")
        return served

    def generate(self, prompts: list[list[int]], max_new_tokens: int, concurrency: int,
                 progress: bool = True) -> list[str]:
        return greedy_completions(self.url, self.model, prompts, max_new_tokens, self.max_model_len, concurrency,
                                  api_key=self.api_key, progress=progress)

    def opts_effective(self) -> dict[str, dict]:
        return {k: {**v, "warning": WARNING} for k, v in self._effective.items()}
