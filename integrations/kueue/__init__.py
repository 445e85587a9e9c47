"""Kubernetes clusters scheduled by Kueue: the AdmissionCheck controller (docs/kubernetes.md)."""
