"""Clouds on a laptop: moto's server for AWS (with its pricing APIs), a GCE fake, a Cloud
Billing Catalog fake, spot and price market replay, fault injection, and instances that
really run their boot scripts (as local processes)."""

from providers.local.aws import LocalAws
from providers.local.billing_fake import BillingFake
from providers.local.faults import Fault, FaultInjector
from providers.local.gce_fake import GceFake
from providers.local.instances import LocalInstance, LocalInstances
from providers.local.market import MarketReplay, default_assignments
from providers.local.stack import LocalCloud

__all__ = [
    "BillingFake",
    "Fault",
    "FaultInjector",
    "GceFake",
    "LocalAws",
    "LocalCloud",
    "LocalInstance",
    "LocalInstances",
    "MarketReplay",
    "default_assignments",
]
