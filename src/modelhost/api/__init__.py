"""HTTP layer: thin routers over the services. The only part that imports FastAPI."""
