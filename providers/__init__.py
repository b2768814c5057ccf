"""Cloud adapters behind one Provider protocol; ``providers.local`` runs clouds on a laptop."""

from providers.base import (
    CapacityError,
    InstanceNotFound,
    InstanceRef,
    InstanceState,
    LaunchRequest,
    ObjectNotFound,
    Provider,
    ProviderError,
    QuotaError,
    TransientError,
)

__all__ = [
    "CapacityError",
    "InstanceNotFound",
    "InstanceRef",
    "InstanceState",
    "LaunchRequest",
    "ObjectNotFound",
    "Provider",
    "ProviderError",
    "QuotaError",
    "TransientError",
]
