"""docker-compose.yml and the FastAPI example, exercised for real where it can be."""

from __future__ import annotations

import os
import time
from pathlib import Path

import yaml
from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[2]


def test_compose_services_share_one_database():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    pg = services["postgres"]["environment"]
    expected = (
        f"postgresql://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}"
        f"@postgres:5432/{pg['POSTGRES_DB']}"
    )
    app_services = {name: s for name, s in services.items() if name != "postgres"}
    assert {"worker", "producer"} <= set(app_services)
    for name, service in app_services.items():
        assert service["environment"]["PG_SCHEDULER_DSN"] == expected, name
        assert "postgres" in service["depends_on"], name
    assert services["worker"]["deploy"]["replicas"] >= 2
    assert services["worker"]["command"][-2:] == ["worker", "examples.app:SETTINGS"]
    # The worker command names a real settings object.
    from examples import app

    assert isinstance(app.SETTINGS, dict)
    # The examples keep to their own schema, in compose too (status, migrate).
    assert app.SETTINGS["schema"] == app.SCHEMA == "examples"
    for name, service in app_services.items():
        assert service["environment"]["PG_SCHEDULER_SCHEMA"] == app.SCHEMA, name


def test_fastapi_lifespan_runs_the_scheduler(dsn, monkeypatch):
    monkeypatch.setenv("PG_SCHEDULER_DSN", dsn)
    from examples.fastapi_app import app

    with TestClient(app) as client:
        response = client.post("/emails", params={"recipient": "ada@example.com"})
        assert response.status_code == 200
        job_id = response.json()["job_id"]
        deadline = time.monotonic() + 15
        while True:
            body = client.get(f"/jobs/{job_id}").json()
            if body["status"] == "completed" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert body["status"] == "completed"
        assert body["result"] == {"recipient": "ada@example.com", "subject": "Welcome!"}
        assert client.get("/jobs/does-not-exist").status_code == 404
    assert os.environ["PG_SCHEDULER_DSN"] == dsn
    # In the examples' schema, not among the application's own jobs in public.
    conn = query_on(dsn)
    try:
        assert conn("SELECT count(*) FROM examples.scheduled_jobs WHERE job_id = $1", job_id) == 1
        assert conn("SELECT count(*) FROM public.scheduled_jobs WHERE job_id = $1", job_id) == 0
    finally:
        conn(None)


def query_on(dsn: str):
    """A tiny synchronous query helper (the test client runs its own event loop)."""
    import psycopg

    conn = psycopg.connect(dsn)

    def query(sql: str | None, *args):
        if sql is None:
            conn.close()
            return None
        return conn.execute(sql.replace("$1", "%s"), args).fetchone()[0]

    return query


def test_compose_keeps_postgres_private_and_the_image_has_the_cli():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    # Publishing 5432 would clash with a PostgreSQL already on the host.
    assert "ports" not in compose["services"]["postgres"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-cache-dir '.[cli]'" in dockerfile


def test_examples_extra_installs_what_the_examples_import():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    examples = {r.split(">")[0].split("[")[0] for r in project["optional-dependencies"]["examples"]}
    assert {"fastapi", "uvicorn"} <= examples
