"""Deployment: the Lambda package of the worker, its deployment, and the container image."""
