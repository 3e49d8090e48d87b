"""LISTEN/NOTIFY on a dedicated connection (``listener``) and the event hub built
on it (``events``)."""
