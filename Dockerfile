FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY pg_scheduler ./pg_scheduler
COPY migrations ./migrations
COPY examples ./examples
RUN pip install --no-cache-dir .
ENV PYTHONPATH=/app
