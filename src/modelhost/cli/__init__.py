"""The `modelhost` command line."""
