"""``match.features`` into the IR: bounds as plain ranges, and the feature router's
settings with every field path it must extract (only when a route needs it)."""

from __future__ import annotations

from collections.abc import Iterable

from inferway.policies.features import FeatureRouter, Features, FieldMatch, NumberRange
from inferway.resolve.ir.features import FeatureRouterIR, FeaturesIR, FieldMatchIR, RangeIR
from inferway.resolve.ir.route import RouteIR

__all__ = ["resolve_feature_router", "resolve_features"]


def resolve_features(features: Features | None) -> FeaturesIR | None:
    if features is None:
        return None
    return FeaturesIR(
        rows=_range(features.rows),
        input_bytes=_range(features.input_bytes),
        fields=tuple(_field(f) for f in features.fields),
        on_malformed=features.on_malformed,
    )


def _range(bounds: NumberRange | None) -> RangeIR | None:
    return None if bounds is None else RangeIR(min=bounds.min, max=bounds.max)


def _field(field: FieldMatch) -> FieldMatchIR:
    bounded = field.min is not None or field.max is not None
    return FieldMatchIR(
        path=field.path,
        exact=field.exact,
        regex=field.regex,
        present=field.present,
        range=RangeIR(min=field.min, max=field.max) if bounded else None,
    )


def resolve_feature_router(
    settings: FeatureRouter, routes: Iterable[RouteIR]
) -> FeatureRouterIR | None:
    """None unless some route matches on features: no body is buffered otherwise."""
    featured = [r.match.features for r in routes if r.match.features is not None]
    if not featured:
        return None
    return FeatureRouterIR(
        host=settings.address,
        port=settings.port,
        timeout=settings.timeout,
        fields=tuple(sorted({f.path for features in featured for f in features.fields})),
    )
