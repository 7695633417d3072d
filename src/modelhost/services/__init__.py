"""Business logic behind the routes: plain Python over the store, testable without a server."""
