"""Watching the queue and its jobs: statistics (``stats``), Prometheus (``metrics``),
OpenTelemetry (``otel``) and the process-wide hooks they plug into (``instrument``)."""
