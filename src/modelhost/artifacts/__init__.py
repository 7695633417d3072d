"""Model artifacts: upload sessions, blob storage, inspection, atomic publishing."""
