"""The flipgate server: SQL store, artifact store and the HTTP API (service.main)."""
