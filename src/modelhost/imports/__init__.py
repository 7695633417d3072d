"""Imports: an artifact filled from where the model lives (S3, HTTPS, a Hugging Face Hub) rather than
pushed by a client. Sits beside `jobs` and `batches`: it uses the artifacts' upload sessions and the
media rules for remote fetches, and nothing above it."""
