"""The registry's HTTP service: ``server.app.create_app`` and bearer-token auth."""
