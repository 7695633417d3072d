"""Wire models (pydantic): one module per API family. Imports nothing else of modelhost."""
