"""The bundled search spaces and profiles, installed as ``umsearch.data`` (see setup.cfg)."""
