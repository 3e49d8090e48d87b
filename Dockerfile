FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY pg_scheduler ./pg_scheduler
COPY examples ./examples
# The cli extra: `docker compose exec worker pg-scheduler status` prints rich tables.
RUN pip install --no-cache-dir '.[cli]'
ENV PYTHONPATH=/app
