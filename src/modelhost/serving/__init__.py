"""OpenAI serving, one module per API family (as vLLM's `serving_chat`): a parsed request in, the
runtime's events assembled into OpenAI's answer out. Routes only parse, call and respond."""
