"""Cluster-side reconcilers: ResourceSlice publisher, allocation controller, webhook, metrics."""
