"""The engine twin's step model per endpoint: learned by the training server, or the prior.

The training server fits the twin's step coefficients per endpoint class and a speed per
endpoint from the engine fields of the EPP's training entries (:mod:`epp_client.engine.features`)
and publishes them in the bundle manifest's ``engine`` section (``features.bundle.validate_engine``);
the prediction servers serve it at ``GET /v1/engine``. :class:`StepModels` gives the
``decode-harm`` plugins the step model of an endpoint: its class's learned coefficients divided
by its learned speed (1 without one of its own), or the configured prior (the ``step*``
parameters and ``engineSpeed``) for a class not learned, or before any section arrives. It reads
the section through ``source`` (the predictor's ``engine_section``: the in-process bundle's, or
the one :class:`epp_client.engine_fetch.EngineFetcher` fetched), once per decision, and parses a
new one only when its version changes; a section that fails validation is ignored (the last good
one is kept). :class:`LearnedTwin` is the twin over those per-endpoint step models.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from epp_client.engine.twin import StepModel
from epp_client.engine.twin_engine import TwinEngine
from epp_client.types import Endpoint
from features.bundle import BundleError, validate_engine
from features.schema import DEFAULT_ENGINE_CLASS, ENGINE_COEFFICIENTS

log = logging.getLogger("epp_client.engine")

#: what a predictor's ``engine_section()`` returns: (bundle version, the manifest's engine section)
EngineSection = tuple[str, Mapping[str, Any]]


def engine_class(endpoint: Endpoint, model_label: str, shape_label: str) -> str:
    """An endpoint's class: the model it serves and its pod shape, read from its labels
    (``model|shape``, ``-`` for a part without its label; ``default`` without either)."""
    labels = endpoint.labels
    model = str(labels.get(model_label) or "") if model_label else ""
    shape = str(labels.get(shape_label) or "") if shape_label else ""
    if not model and not shape:
        return DEFAULT_ENGINE_CLASS
    return f"{model or '-'}|{shape or '-'}"


class LearnedEngine:
    """A validated engine section: per class its coefficients and its endpoints' speeds."""

    def __init__(self, version: str, section: Mapping[str, Any]) -> None:
        validate_engine(section)
        self.version = version
        self.classes: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
        for cls, spec in section["classes"].items():
            coef = {name: float(spec["coefficients"][name]) for name in ENGINE_COEFFICIENTS}
            speeds = {ep: float(e["speed"]) for ep, e in (spec.get("endpoints") or {}).items()}
            self.classes[str(cls)] = (coef, speeds)

    def step_model(self, cls: str, endpoint: str) -> StepModel | None:
        """The learned step model of ``endpoint`` in class ``cls``; None for a class not learned."""
        learned = self.classes.get(cls)
        if learned is None:
            return None
        coef, speeds = learned
        return StepModel(coef["fixed_ms"], coef["per_token_ms"], coef["per_context_token_ms"], coef["decode_ms"],
                         coef["per_prefill_pair_ms"], speeds.get(endpoint, 1.0))


class StepModels:
    """Per endpoint, the step model the twin uses (see the module docstring). ``source``: None,
    or a callable returning the newest :data:`EngineSection` (None while there is none)."""

    def __init__(self, prior: StepModel, source: Callable[[], EngineSection | None] | None = None) -> None:
        self.prior = prior
        self.source = source
        self.learned: LearnedEngine | None = None
        self._refused: str | None = None       # the version of a section that failed validation
        self._models: dict[tuple[str, str], StepModel] = {}

    def refresh(self) -> None:
        """Take the source's newest section when its version is new (cheap otherwise)."""
        if self.source is None:
            return
        got = self.source()
        if got is None:
            return
        version, section = got
        if (self.learned is not None and version == self.learned.version) or version == self._refused:
            return
        try:
            self.learned = LearnedEngine(version, section)
        except (BundleError, KeyError, TypeError, ValueError) as e:
            self._refused = version
            log.warning("engine section of %s ignored: %s", version, e)
            return
        self._models.clear()    # new objects: the twin's decode cache is keyed by the model

    def for_endpoint(self, cls: str, endpoint: str) -> StepModel:
        """The step model of ``endpoint`` (class ``cls``): learned, else the prior."""
        key = (cls, endpoint)
        model = self._models.get(key)
        if model is None:
            learned = self.learned.step_model(cls, endpoint) if self.learned is not None else None
            model = self._models[key] = learned if learned is not None else self.prior
        return model


class LearnedTwin(TwinEngine):
    """The engine twin (:class:`TwinEngine`, one placement or all candidates at once) with each
    endpoint's own step model (:class:`StepModels`, the endpoint's class from ``class_of``)."""

    def __init__(self, models: StepModels, class_of: Callable[[Endpoint], str], budget: int, probe: int,
                 max_steps: int) -> None:
        super().__init__(models.prior, budget, probe, max_steps)
        self.models, self.class_of = models, class_of

    def model_for(self, endpoint: Endpoint) -> StepModel:
        models = self.models
        if models.learned is None:      # nothing learned yet: the prior, without a class lookup
            return models.prior
        return models.for_endpoint(self.class_of(endpoint), endpoint.name)
