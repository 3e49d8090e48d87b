"""The lowest layer: JSON encoding, argument checks, logging, time, reconnects and
connection set-up. Imports nothing from pg_scheduler above it."""
